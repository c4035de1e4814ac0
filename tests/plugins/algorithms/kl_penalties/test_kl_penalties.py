import math

import pytest
import torch

from plugrl_kl_penalties import penalties as K

LOG_PROB = [-1.0, -2.0, -0.5]
REF_LOG_PROB = [-1.5, -1.0, -0.5]
# d = log_prob - ref = [0.5, -1.0, 0.0]
VALUES = {
    "kl": [0.5, -1.0, 0.0],
    "abs": [0.5, 1.0, 0.0],
    "mse": [0.125, 0.5, 0.0],
    "low_var_kl": [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0],
}
# d(value)/d(log_prob): k1 -> 1, abs -> sign(d), k2 -> d, k3 -> 1 - exp(-d)
GRADIENTS = {
    "kl": [1.0, 1.0, 1.0],
    "abs": [1.0, -1.0, 0.0],
    "mse": [0.5, -1.0, 0.0],
    "low_var_kl": [1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0],
}
ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def evaluate(plugins, name):
    penalty = plugins.registry("kl_penalties").load(name)
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    value = penalty(log_prob, torch.tensor(REF_LOG_PROB))
    (gradient,) = torch.autograd.grad(value.sum(), log_prob)
    return value.detach().tolist(), gradient.tolist()


@pytest.mark.parametrize("name", [*VALUES, *ALIASES])
def test_estimator_values_and_gradients(plugins, name):
    base = ALIASES.get(name, name)
    value, gradient = evaluate(plugins, name)
    assert value == pytest.approx(VALUES[base])
    assert gradient == pytest.approx(GRADIENTS[base])


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("kl+", "kl"),
        ("k1+", "kl"),
        ("abs+", "abs"),
        ("low_var_kl+", "low_var_kl"),
        ("k3+", "low_var_kl"),
        ("mse+", "mse"),
        ("k2+", "mse"),
    ],
)
def test_straight_through_variants_take_the_value_and_the_k2_gradient(plugins, name, base):
    value, gradient = evaluate(plugins, name)
    assert value == pytest.approx(VALUES[base])
    assert gradient == pytest.approx(GRADIENTS["mse"])


def test_low_var_kl_is_clamped():
    log_prob = torch.tensor([30.0, -30.0, 0.0])
    ref = torch.tensor([0.0, 0.0, -0.0])
    # d = +30: exp(-20) + 20 - 1 > 10; d = -30: exp(20) - 20 - 1 > 10; both clamp to 10
    assert K.kl_k3(log_prob, ref).tolist() == pytest.approx([10.0, 10.0, 0.0])
