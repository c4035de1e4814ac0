import math

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import KLControlConfig
from plugrl_plugins.algorithms import kl as K

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


def test_fixed_controller_keeps_its_value():
    controller = K.make_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    controller.update(current_kl=3.0, n_steps=100)
    assert controller.value == 0.05


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        (0.3, 0.1 * (1 + 0.2 * 10 / 100)),  # error 0.5, clipped to 0.2
        (0.1, 0.1 * (1 - 0.2 * 10 / 100)),  # error -0.5, clipped to -0.2
        (0.22, 0.1 * (1 + 0.1 * 10 / 100)),  # error 0.1
    ],
)
def test_adaptive_controller_moves_towards_the_target(current_kl, expected):
    config = KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.2, horizon=100)
    controller = K.make_kl_controller(config)
    controller.update(current_kl=current_kl, n_steps=10)
    assert controller.value == pytest.approx(expected)


def test_adaptive_controller_needs_a_positive_target():
    config = KLControlConfig(type="adaptive", target_kl=0.0)
    with pytest.raises(RecipeError, match=r"algorithm.kl_ctrl.target_kl: the adaptive KL"):
        K.make_kl_controller(config)


def test_controller_state_round_trip():
    config = KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.2, horizon=100)
    controller = K.make_kl_controller(config)
    controller.update(current_kl=0.3, n_steps=10)
    restored = K.make_kl_controller(config)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value != 0.1


def kl_batch():
    return Batch(
        {
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, 0.0]]),
            "ref_log_prob": torch.tensor([[-1.5, -1.0], [-1.0, 5.0]]),
        }
    )


def test_kl_in_reward_penalises_scores_and_reports_the_batch_kl():
    batch = kl_batch()
    controller = K.FixedKLController(0.1)
    metrics = K.apply_kl_in_reward(batch, controller, K.kl_k1)
    # k1 = [[0.5, 0], [-1, (padding)]]; rewards = scores - 0.1 * k1
    assert batch["token_level_rewards"].tolist() == [
        pytest.approx([-0.05, 1.0]),
        pytest.approx([0.6, 0.0]),
    ]
    # mean over responses of each response's token mean: (0.25 + -1) / 2
    assert metrics == {
        "actor/reward_kl_penalty": pytest.approx(-0.375),
        "actor/reward_kl_penalty_coeff": 0.1,
    }


def test_kl_in_reward_updates_an_adaptive_controller_with_the_batch_size():
    controller = K.AdaptiveKLController(0.1, target_kl=0.2, horizon=100)
    metrics = K.apply_kl_in_reward(kl_batch(), controller, K.kl_abs)
    # |d| = [[0.5, 0], [1, -]]: batch KL (0.25 + 1) / 2 = 0.625 > target, error clipped to 0.2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.625)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 2 / 100))


def test_kl_in_reward_names_missing_columns():
    batch = kl_batch()
    batch.pop("ref_log_prob")
    with pytest.raises(KeyError, match=r"KL in reward \(algorithm.use_kl_in_reward\) needs"):
        K.apply_kl_in_reward(batch, K.FixedKLController(0.1), K.kl_k1)


def test_kl_in_reward_from_the_recipe_keeps_its_controller(recipe_from, plugins):
    recipe = recipe_from(
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_penalty=abs",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.1",
        "algorithm.kl_ctrl.target_kl=0.2",
        "algorithm.kl_ctrl.horizon=100",
    )
    kl_in_reward = K.KLInReward.from_recipe(recipe, plugins)
    first = kl_in_reward(kl_batch())
    second = kl_in_reward(kl_batch())
    assert first["actor/reward_kl_penalty_coeff"] == 0.1
    assert second["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1 * 1.004)
    resumed = K.KLInReward.from_recipe(recipe, plugins)
    resumed.load_state_dict(kl_in_reward.state_dict())
    assert resumed.controller.value == pytest.approx(0.1 * 1.004**2)
