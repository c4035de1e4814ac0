import math

import pytest
import torch

from plugrl.algorithms.functional import LossAggregator
from plugrl.parts.backend import ActorConfig
from plugrl.testing import part_context
from plugrl_policy_losses import losses as L
from plugrl_policy_losses.options import ClipCovArgs, KLCovArgs, SapoArgs

CONFIG = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
TOKEN_MEAN = LossAggregator("token-mean")
METRIC_KEYS = {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}


def build(cls, config, options=None):
    return cls(config, part_context(options=options))


def call(loss, old, new, advantages, mask, aggregate=TOKEN_MEAN, weights=None):
    """Run ``loss`` with log-probs built from ratios; return the loss, its gradient with
    respect to the log-probs, and the metrics."""
    log_prob = torch.tensor([new], dtype=torch.float64, requires_grad=True)
    value, metrics = loss(
        old_log_prob=torch.tensor([old], dtype=torch.float64),
        log_prob=log_prob,
        advantages=torch.tensor([advantages], dtype=torch.float64),
        response_mask=torch.tensor([mask]),
        aggregate=aggregate,
        importance_weights=None
        if weights is None
        else torch.tensor([weights], dtype=torch.float64),
    )
    (gradient,) = torch.autograd.grad(value, log_prob)
    assert set(metrics) == METRIC_KEYS
    assert metrics["actor/pg_loss"] == pytest.approx(float(value.detach()))
    return float(value.detach()), gradient[0].tolist(), metrics


def logs(ratios, base=-1.0):
    """old and new log-probs whose ratio is ``ratios``."""
    return [base] * len(ratios), [base + math.log(r) for r in ratios]


# vanilla PPO, clip 0.8 .. 1.28, dual clip 3. Per token:
#  A=+1 r=1.5: max(-1.5, -1.28) = -1.28 (clipped)       A=+1 r=0.5: max(-0.5, -0.8) = -0.5
#  A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped), < 3       A=-1 r=5: max(5, 1.28) = 5 -> dual 3
#  A=+2 r=1:   -2                                       last token: padding
VANILLA_RATIOS = [1.5, 0.5, 0.5, 5.0, 1.0, 7.0]
VANILLA_ADV = [1.0, 1.0, -1.0, -1.0, 2.0, 100.0]
VANILLA_MASK = [1, 1, 1, 1, 1, 0]


def test_vanilla_ppo_clip_and_dual_clip():
    old, new = logs(VANILLA_RATIOS)
    value, gradient, metrics = call(
        build(L.VanillaPPO, CONFIG), old, new, VANILLA_ADV, VANILLA_MASK
    )
    assert value == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0 - 2.0) / 5)
    # only unclipped tokens carry a gradient: -A * r / 5
    assert gradient == pytest.approx([0.0, -0.5 / 5, 0.0, 0.0, -2.0 / 5, 0.0])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    ppo_kl = -(math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 5
    assert metrics["actor/ppo_kl"] == pytest.approx(ppo_kl)


def test_vanilla_uses_clip_ratio_when_low_and_high_are_unset():
    config = ActorConfig(clip_ratio=0.1)
    old, new = logs([1.5, 0.5])
    value, _, _ = call(build(L.VanillaPPO, config), old, new, [1.0, -1.0], [1, 1])
    assert value == pytest.approx((-1.1 + 0.9) / 2)


def test_vanilla_multiplies_by_importance_weights():
    old, new = logs(VANILLA_RATIOS)
    weights = [2.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    value, gradient, _ = call(
        build(L.VanillaPPO, CONFIG), old, new, VANILLA_ADV, VANILLA_MASK, weights=weights
    )
    assert value == pytest.approx((-2.56 - 0.5 + 0.8 + 3.0 - 1.0) / 5)
    assert gradient == pytest.approx([0.0, -0.1, 0.0, 0.0, -0.2, 0.0])


def test_vanilla_log_ratio_is_clamped():
    # log ratio 30 is clamped to 20 before exp
    value, _, metrics = call(build(L.VanillaPPO, CONFIG), [-31.0], [-1.0], [-1.0], [1])
    assert value == pytest.approx(3.0)
    assert metrics["actor/ppo_kl"] == pytest.approx(-20.0)


@pytest.mark.parametrize(
    ("cls", "options", "bounded"),
    [
        (L.VanillaPPO, None, True),
        (L.CISPO, None, True),
        (L.ClipCov, ClipCovArgs(), False),
        (L.KLCov, KLCovArgs(), False),
        (L.GeoMean, None, False),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_the_token_log_ratio_is_clamped_where_verl_clamps_it(cls, options, bounded):
    # a log ratio of 30: verl clamps it to 20 in vanilla and cispo only (see losses.py)
    value, _, metrics = call(build(cls, CONFIG, options), [-31.0], [-1.0], [1.0], [1])
    assert math.isfinite(value)
    assert metrics["actor/ppo_kl"] == pytest.approx(-20.0 if bounded else -30.0)


def test_gspo_clips_the_sequence_ratio():
    # row 0: token ratios 1.2, 1.2 -> sequence ratio 1.2 (inside); row 1: 2 and 1 ->
    # sqrt(2) = 1.414 > 1.28, A > 0: clipped
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    new = [[-1.0 + math.log(1.2)] * 2, [-1.0 + math.log(2.0), -1.0]]
    log_prob = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    value, metrics = build(L.GSPO, CONFIG)(
        old_log_prob=torch.tensor(old, dtype=torch.float64),
        log_prob=log_prob,
        advantages=torch.ones(2, 2, dtype=torch.float64),
        response_mask=torch.ones(2, 2),
        aggregate=TOKEN_MEAN,
    )
    assert float(value.detach()) == pytest.approx((-1.2 * 2 - 1.28 * 2) / 4)
    (gradient,) = torch.autograd.grad(value, log_prob)
    # each unclipped token: -A * s / 4 through its own log-prob
    assert gradient.tolist() == [pytest.approx([-0.3, -0.3]), pytest.approx([0.0, 0.0])]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_gspo_sequence_log_ratio_is_capped_at_10():
    value, _, _ = call(build(L.GSPO, ActorConfig(clip_ratio=1e9)), [-13.0], [-1.0], [-1.0], [1])
    assert value == pytest.approx(math.exp(10.0))


def test_cispo_weights_reinforce_by_the_clipped_ratio_without_its_gradient():
    old = [-1.0 - math.log(1.5), -2.0]
    value, gradient, metrics = call(build(L.CISPO, CONFIG), old, [-1.0, -2.0], [1.0, -1.0], [1, 1])
    # token 0: -1.28 * 1 * (-1); token 1: -1 * (-1) * (-2)
    assert value == pytest.approx((1.28 - 2.0) / 2)
    assert gradient == pytest.approx([-1.28 / 2, 1.0 / 2])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_reinforce_is_minus_advantage_times_log_prob():
    value, gradient, metrics = call(
        build(L.Reinforce, CONFIG), [-1.5, -1.0], [-1.0, -0.5], [1.0, -2.0], [1, 1]
    )
    assert value == pytest.approx((1.0 - 1.0) / 2)
    assert gradient == pytest.approx([-0.5, 1.0])
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.5)
    assert metrics["actor/pg_clipfrac"] == 0.0


def geo_call(aggregate, weights=None):
    log_ratio = [[0.1, 0.5], [-0.5, 0.0], [0.0, 0.0]]
    log_prob = torch.tensor(log_ratio, dtype=torch.float64, requires_grad=True)
    value, metrics = build(L.GeoMean, CONFIG)(
        old_log_prob=torch.zeros(3, 2, dtype=torch.float64),
        log_prob=log_prob,
        advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0], [5.0, 5.0]], dtype=torch.float64),
        response_mask=torch.tensor([[1, 1], [1, 1], [0, 0]]),  # the third response is empty
        aggregate=aggregate,
        importance_weights=weights,
    )
    return value, metrics


def test_geo_mean_clips_in_log_space_and_averages_over_responses():
    value, metrics = geo_call(TOKEN_MEAN)
    # row 0 (A > 0): log ratios clipped to [0.1, 0.28]: ratio exp(0.19), loss -exp(0.19)
    # row 1 (A < 0): clipped to [-0.2, 0]: ratio exp(-0.1), loss +exp(-0.1)
    expected = (-math.exp(0.19) + math.exp(-0.1)) / 2
    assert float(value.detach()) == pytest.approx(expected)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)
    # per response whatever loss_agg_mode says
    assert float(geo_call(LossAggregator("token-sum"))[0].detach()) == pytest.approx(expected)


def test_geo_mean_applies_the_geometric_mean_of_token_weights():
    weights = torch.tensor([[4.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    value, _ = geo_call(TOKEN_MEAN, weights)
    assert float(value.detach()) == pytest.approx((-2 * math.exp(0.19) + math.exp(-0.1)) / 2)


def test_kl_cov_penalises_the_highest_covariance_token():
    # advantages [1, 1, -1, -1], log-probs [-1, -3, -1, -4] (mean -2.25):
    # covariances [1.25, -0.75, -1.25, 1.75]: one token (4 * 0.25) penalised, the last
    old = [-1.0, -3.0, -1.0, -4.5]
    new = [-1.0, -3.0, -1.0, -4.0]
    loss = build(L.KLCov, CONFIG, KLCovArgs(kl_cov_ratio=0.25, ppo_kl_coef=0.1))
    value, gradient, metrics = call(loss, old, new, [1.0, 1.0, -1.0, -1.0], [1, 1, 1, 1])
    assert value == pytest.approx((-1 - 1 + 1 + math.exp(0.5) + 0.1 * 0.5) / 4)
    assert gradient == pytest.approx([-0.25, -0.25, 0.25, (math.exp(0.5) + 0.1) / 4])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)


def test_clip_cov_cuts_the_gradient_of_high_covariance_tokens():
    # advantages [2, 1, 0, -2] (mean 0.25), log-probs [-1, -2, -2, -3] (mean -2):
    # covariances [1.75, 0, 0, 2.25]; tokens 0 and 3 are in (1, 5)
    new = [-1.0, -2.0, -2.0, -3.0]
    args = ClipCovArgs(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    value, gradient, metrics = call(
        build(L.ClipCov, CONFIG, args), new, new, [2.0, 1.0, 0.0, -2.0], [1] * 4
    )
    assert value == pytest.approx(-1.0 / 4)
    assert gradient == pytest.approx([0.0, -0.25, 0.0, 0.0])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_clip_cov_cuts_at_most_its_budget_and_respects_the_upper_bound():
    new = [-1.0, -2.0, -2.0, -3.0]
    # budget max(int(0.25 * 4), 1) = 1 of the two candidates, chosen at random
    args = ClipCovArgs(clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
    value, _, metrics = call(
        build(L.ClipCov, CONFIG, args), new, new, [2.0, 1.0, 0.0, -2.0], [1] * 4
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert value in (pytest.approx((-1.0 + 2.0) / 4), pytest.approx((-2.0 - 1.0) / 4))
    # an upper bound below 2.25 leaves only token 0
    args = ClipCovArgs(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=2.0)
    value, _, _ = call(build(L.ClipCov, CONFIG, args), new, new, [2.0, 1.0, 0.0, -2.0], [1] * 4)
    assert value == pytest.approx((-1.0 + 2.0) / 4)


def test_clip_cov_skips_tokens_already_clipped_by_ppo():
    # token 0 has ratio 2 with A > 0: clipped by PPO already, so not a candidate
    old = [-1.0 - math.log(2.0), -2.0, -2.0, -3.0]
    new = [-1.0, -2.0, -2.0, -3.0]
    args = ClipCovArgs(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    value, _, metrics = call(
        build(L.ClipCov, CONFIG, args), old, new, [2.0, 1.0, 0.0, -2.0], [1] * 4
    )
    assert value == pytest.approx((-2 * 1.28 - 1.0) / 4)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)


ALL_LOSSES = [L.VanillaPPO, L.GSPO, L.ClipCov, L.KLCov, L.GeoMean, L.CISPO, L.Reinforce]


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=lambda cls: cls.name)
def test_empty_responses_contribute_nothing(loss):
    old = torch.tensor([[-1.0, -1.2], [-0.7, -3.0]], dtype=torch.float64)
    new = torch.tensor([[-0.9, -1.0], [5.0, 5.0]], dtype=torch.float64, requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [50.0, 50.0]], dtype=torch.float64)
    kwargs = {"old_log_prob": old, "advantages": advantages, "aggregate": TOKEN_MEAN}
    with_empty, _ = build(loss, CONFIG)(
        log_prob=new, response_mask=torch.tensor([[1, 1], [0, 0]]), **kwargs
    )
    (gradient,) = torch.autograd.grad(with_empty, new)
    assert torch.all(gradient[1] == 0)
    alone, _ = build(loss, CONFIG)(
        log_prob=new[:1],
        response_mask=torch.tensor([[1, 1]]),
        **{**kwargs, "old_log_prob": old[:1], "advantages": advantages[:1]},
    )
    assert float(with_empty.detach()) == pytest.approx(float(alone.detach()))


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=lambda cls: cls.name)
def test_only_empty_responses_give_a_zero_finite_loss(loss):
    value, metrics = build(loss, CONFIG)(
        old_log_prob=torch.zeros(2, 3),
        log_prob=torch.zeros(2, 3, requires_grad=True),
        advantages=torch.ones(2, 3),
        response_mask=torch.zeros(2, 3),
        aggregate=TOKEN_MEAN,
    )
    assert float(value.detach()) == 0.0
    assert all(math.isfinite(v) for v in metrics.values())


def test_sapo_gates_the_ratio_softly_and_averages_per_sequence():
    # sequence 0: two tokens, ratios 1.5 and 1 with A = +1 (tau_pos 1); sequence 1: one token
    # of ratio 0.5 with A = -2 (tau_neg 1.05)
    old = [[-1.0 - math.log(1.5), -2.0], [-1.0 - math.log(0.5), 0.0]]
    new = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss = build(L.SAPO, CONFIG, SapoArgs())
    value, metrics = loss(
        old_log_prob=torch.tensor(old, dtype=torch.float64),
        log_prob=new,
        advantages=torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64),
        response_mask=torch.tensor([[1, 1], [1, 0]]),
        aggregate=TOKEN_MEAN,
    )

    def gate(ratio, tau):
        return 4.0 / tau / (1.0 + math.exp(-tau * (ratio - 1.0)))

    first = (-gate(1.5, 1.0) - gate(1.0, 1.0)) / 2  # the mean over the sequence's tokens
    second = 2.0 * gate(0.5, 1.05)
    # per sequence whatever loss_agg_mode says (token-mean here would weigh 3 tokens alike)
    assert float(value) == pytest.approx((first + second) / 2)
    value.backward()
    # the gate's slope is 1 at ratio 1: the on-policy gradient of -A * log_prob, / 2 tokens
    # / 2 sequences
    assert float(new.grad[0, 1]) == pytest.approx(-1.0 / 4)
    assert float(new.grad[1, 1]) == 0.0
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_sapo_rejects_a_temperature_that_is_not_positive():
    from plugrl.config.structuring import structure
    from plugrl.errors import RecipeError

    with pytest.raises(RecipeError, match=r"tau_neg: must be > 0"):
        structure(SapoArgs, {"tau_neg": 0}, "actor.policy_loss_args")
