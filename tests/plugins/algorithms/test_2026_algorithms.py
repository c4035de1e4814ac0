"""Hand values and refusals of the algorithms added in 2026 (optimal token baseline, GDPO,
DPPO, IcePop, KPop); their parity with verl is in ``test_verl_2026_parity.py``."""

import math

import pytest
import torch

from plugrl.algorithms.checks import check_algorithm
from plugrl.algorithms.functional import binary_kl, compute_rollout_is_weights
from plugrl.algorithms.training import ENTROPY_SLICE_TOKENS, sum_pi_squared
from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError
from plugrl.parts.algorithm import AlgorithmConfig
from plugrl.parts.backend import ActorConfig
from plugrl.testing import part_context
from plugrl_estimators import estimators as E
from plugrl_estimators.options import GDPOArgs
from plugrl_policy_losses import losses as L


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- optimal token baseline


def otb_batch(rewards, mask, uids, token_prob=0.5, squares=0.5):
    rewards = torch.tensor(rewards)
    return Batch(
        {
            "token_level_rewards": rewards,
            "response_mask": torch.tensor(mask),
            "old_log_probs": torch.full_like(rewards, math.log(token_prob)),
            "sum_pi_squared": torch.full_like(rewards, squares),
        },
        {"uid": uids},
    )


def otb(cls=E.OptimalTokenBaseline, batch=None):
    return cls(AlgorithmConfig(), part_context()).compute(batch)


def test_otb_with_equal_weights_is_the_group_mean_of_returns_per_position():
    # w_t = 1 - 2 * 0.5 + 0.5 = 0.5 everywhere, equal lengths: every W_t is the same, so the
    # baseline is the plain mean of the returns-to-go at each position
    batch = otb_batch([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]], [[1, 1]] * 3, ["a", "a", "b"])
    advantages, returns = otb(batch=batch)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 0.0]]))
    # group b has one response: baseline 0, advantage = its return
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.5], [-0.5, -0.5], [2.0, 0.0]]))


def test_otb_weighs_each_response_by_its_accumulated_variance_proxy():
    # response 0's token is confident (pi 0.9, sum pi^2 0.82): w = 1 - 1.8 + 0.82 = 0.02;
    # response 1's is not (pi 0.1, sum pi^2 0.1): w = 1 - 0.2 + 0.1 = 0.9
    rewards = torch.tensor([[1.0], [0.0]])
    batch = Batch(
        {
            "token_level_rewards": rewards,
            "response_mask": torch.ones(2, 1, dtype=torch.long),
            "old_log_probs": torch.log(torch.tensor([[0.9], [0.1]])),
            "sum_pi_squared": torch.tensor([[0.82], [0.1]]),
        },
        {"uid": ["a", "a"]},
    )
    advantages, _ = otb(batch=batch)
    baseline = (1.0 * 0.02 + 0.0 * 0.9) / (0.02 + 0.9)
    torch.testing.assert_close(
        advantages, torch.tensor([[1 - baseline], [-baseline]]), atol=1e-6, rtol=0
    )


def test_otb_zero_tail_and_the_valid_token_alignment():
    # one response strictly longest: past the second longest its baseline is 0
    batch = otb_batch([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [[1, 1, 1], [1, 0, 0]], ["a", "a"])
    advantages, _ = otb(batch=batch)
    assert advantages[0, 1:].tolist() == [1.0, 1.0]  # its own return, baseline 0
    assert advantages[0, 0] == pytest.approx(0.0)
    # tool output (mask 0) at position 1 of response 0: the tir variant compares the k-th
    # valid tokens (returns-to-go (1, 1) against (1, 0.5), equal weights: baseline 0.75 at
    # k = 1); by position, each of the last two columns has one valid token, its own baseline
    holed = otb_batch([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]], [[1, 0, 1], [1, 1, 0]], ["a", "a"])
    tir, _ = otb(E.TIROptimalTokenBaseline, holed)
    torch.testing.assert_close(tir, torch.tensor([[0.0, 0.0, 0.25], [0.0, -0.25, 0.0]]))
    by_position, _ = otb(batch=holed)
    torch.testing.assert_close(by_position, torch.zeros(2, 3))


def test_otb_names_the_missing_column():
    whole = otb_batch([[1.0]], [[1]], ["a"])
    columns = {name: whole[name] for name in ("token_level_rewards", "response_mask")}
    batch = Batch({**columns, "old_log_probs": whole["old_log_probs"]}, {"uid": ["a"]})
    with pytest.raises(KeyError, match="needs batch columns sum_pi_squared") as error:
        otb(batch=batch)
    one_line(error)


def test_otb_is_refused_at_start_up_with_a_backend_without_the_column(recipe_from, plugins):
    # the stand-in fsdp2 of these tests declares nothing (the real ones declare it)
    recipe = recipe_from("algorithm.adv_estimator=optimal_token_baseline", "rollout.n=4")
    with pytest.raises(RecipeError, match="does not compute") as error:
        check_algorithm(recipe, plugins)
    assert "algorithm.adv_estimator" in one_line(error)


def test_the_real_backends_compute_the_column():
    from plugrl_fsdp2.backend import FSDP2Backend

    assert FSDP2Backend.computes_sum_pi_squared
    megatron = pytest.importorskip("plugrl_megatron.backend")
    assert megatron.MegatronBackend.computes_sum_pi_squared


def test_sum_pi_squared_across_slices_equals_the_direct_square():
    logits = torch.randn(ENTROPY_SLICE_TOKENS + 37, 11) * 3
    direct = torch.softmax(logits, dim=-1).square().sum(-1)
    torch.testing.assert_close(sum_pi_squared(logits), direct, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------- GDPO


def gdpo(args, norm=True):
    return E.GDPO(AlgorithmConfig(norm_adv_by_std_in_grpo=norm), part_context(options=args))


def test_gdpo_normalises_each_component_apart_then_whitens():
    # accuracy 1, 0 normalises to +-0.7071 and format 0.0, 0.2 to -+0.7071 (each by its own
    # group std); weighted 1 and 0.5 they sum to +-0.3536, whitened over the 4 valid tokens
    # (unbiased std 0.408): +-0.866. Normalised together (GRPO) the sum 1.0, 0.2 would give
    # +-0.7071 whatever the weights
    mask = torch.ones(2, 2, dtype=torch.long)
    batch = Batch(
        {"token_level_rewards": torch.zeros(2, 2), "response_mask": mask},
        {"uid": ["a", "a"], "acc": [1.0, 0.0], "fmt": [0.0, 0.2]},
    )
    weighted = GDPOArgs(gdpo_reward_keys=["acc", "fmt"], gdpo_reward_weights=[1.0, 0.5])
    advantages, _ = gdpo(weighted).compute(batch)
    expected = math.sqrt(3) / 2
    torch.testing.assert_close(
        advantages, torch.tensor([[expected] * 2, [-expected] * 2]), atol=1e-4, rtol=0
    )
    # Dr.GRPO's form (no std): 0.5 - 0.5 * 0.1 = 0.45 each way, whitened alike
    advantages, _ = gdpo(weighted, norm=False).compute(batch)
    torch.testing.assert_close(
        advantages, torch.tensor([[expected] * 2, [-expected] * 2]), atol=1e-4, rtol=0
    )


def test_gdpo_refuses_bad_options_in_one_line():
    with pytest.raises(RecipeError, match="gdpo_reward_keys") as error:
        gdpo(GDPOArgs())
    one_line(error)
    with pytest.raises(RecipeError, match="gdpo_reward_weights") as error:
        gdpo(GDPOArgs(gdpo_reward_keys=["a", "b"], gdpo_reward_weights=[1.0]))
    one_line(error)


def test_gdpo_names_a_component_the_reward_did_not_return():
    batch = Batch(
        {"token_level_rewards": torch.zeros(1, 1), "response_mask": torch.ones(1, 1)},
        {"uid": ["a"]},
    )
    with pytest.raises(DataError, match="'acc'") as error:
        gdpo(GDPOArgs(gdpo_reward_keys=["acc"])).compute(batch)
    one_line(error)
    text = Batch(
        {"token_level_rewards": torch.zeros(1, 1), "response_mask": torch.ones(1, 1)},
        {"uid": ["a"], "acc": ["yes"]},
    )
    with pytest.raises(DataError, match="one number per response") as error:
        gdpo(GDPOArgs(gdpo_reward_keys=["acc"])).compute(text)
    one_line(error)


def test_gdpo_scores_a_failed_sample_zero_in_each_component():
    mask = torch.ones(3, 1, dtype=torch.long)
    batch = Batch(
        {"token_level_rewards": torch.zeros(3, 1), "response_mask": mask},
        {"uid": ["a"] * 3, "acc": [1.0, None, 0.0]},
    )
    advantages, _ = gdpo(GDPOArgs(gdpo_reward_keys=["acc"])).compute(batch)
    # as if the failed sample had scored 0: (1, 0, 0) normalised and whitened
    assert advantages[:, 0].tolist() == pytest.approx(
        [2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], abs=1e-4
    )


def test_gdpo_options_read_from_a_recipe(recipe_from):
    recipe = recipe_from(
        "algorithm.adv_estimator=gdpo",
        "algorithm.adv_estimator_args.gdpo_reward_keys=[acc,fmt]",
        "algorithm.adv_estimator_args.gdpo_reward_weights=[1,0.5]",
    )
    assert recipe.algorithm.adv_estimator_args == {
        "gdpo_reward_keys": ["acc", "fmt"],
        "gdpo_reward_weights": [1, 0.5],
    }


# ---------------------------------------------------------------------------------- DPPO


def dppo(cls, old_probs, new_probs, advantages, clip_ratio_c=3.0):
    config = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=clip_ratio_c)
    log_prob = torch.log(torch.tensor([new_probs], dtype=torch.float64)).requires_grad_(True)
    value, metrics = cls(config, part_context())(
        old_log_prob=torch.log(torch.tensor([old_probs], dtype=torch.float64)),
        log_prob=log_prob,
        advantages=torch.tensor([advantages], dtype=torch.float64),
        response_mask=torch.ones(1, len(old_probs)),
        aggregate=lambda values, mask: (values * mask).sum() / mask.sum(),
    )
    (gradient,) = torch.autograd.grad(value, log_prob)
    return float(value.detach()), gradient[0].tolist(), metrics


def test_dppo_tv_drops_tokens_whose_probability_moved_too_far():
    # A > 0: 0.5 -> 0.6 kept (+0.1 <= 0.28), 0.5 -> 0.9 dropped (+0.4);
    # A < 0: 0.5 -> 0.2 dropped (-0.3 < -0.2), 0.5 -> 0.4 kept
    value, gradient, metrics = dppo(
        L.DPPOTV, [0.5] * 4, [0.6, 0.9, 0.2, 0.4], [1.0, 1.0, -1.0, -1.0]
    )
    expected = (-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4
    assert value == pytest.approx(expected)
    # the ratio is a weight without gradient: d/dlogp of -A * w * logp is -A * w
    assert gradient == pytest.approx([-1.2 / 4, 0.0, 0.0, 0.8 / 4])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_dppo_kl_keeps_moves_against_the_advantage_and_truncates_the_weight():
    # A > 0 and the probability fell: kept whatever the divergence; ratio 0.1 / 0.5
    # A > 0, 0.5 -> 0.9: binary KL 0.51 > 0.28, dropped
    value, _, metrics = dppo(L.DPPOKL, [0.5, 0.5], [0.1, 0.9], [1.0, 1.0])
    assert binary_kl(torch.tensor(0.5), torch.tensor(0.9)) > 0.28
    assert value == pytest.approx(-0.2 * math.log(0.1) / 2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # a ratio of 4 is truncated at clip_ratio_c 1.5 on a kept token (A < 0, probability rose)
    value, _, metrics = dppo(L.DPPOKL, [0.1], [0.4], [-1.0], clip_ratio_c=1.5)
    assert value == pytest.approx(1.5 * math.log(0.4))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------- IcePop, KPop


def weights_of(old_probs, rollout_probs, threshold, kpop=None, level="token"):
    weights, metrics = compute_rollout_is_weights(
        torch.log(torch.tensor([old_probs], dtype=torch.float64)),
        torch.log(torch.tensor([rollout_probs], dtype=torch.float64)),
        torch.ones(1, len(old_probs)),
        level,
        threshold,
        kpop_threshold=kpop,
    )
    return weights[0].tolist(), metrics


def test_icepop_zeroes_ratios_outside_its_band_and_keeps_the_rest_as_they_are():
    # ratios 0.4, 1, 3, 6 with band [0.5, 5]
    weights, metrics = weights_of([0.4, 0.5, 0.6, 0.6], [1.0, 0.5, 0.2, 0.1], "0.5_5.0")
    assert weights == pytest.approx([0.0, 1.0, 3.0, 0.0])
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(0.5)
    # a number truncates instead
    weights, _ = weights_of([0.4, 0.5, 0.6, 0.6], [1.0, 0.5, 0.2, 0.1], 2.0)
    assert weights == pytest.approx([0.4, 1.0, 2.0, 2.0])


def test_kpop_drops_tokens_by_binary_kl_either_way():
    # token 0: same probability, KL 0, kept with ratio 1;
    # token 1: 0.9 vs 0.5, KL(0.9 || 0.5) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.368 > 0.1, dropped;
    # token 2: a rare token 0.001 vs 0.002, ratio 0.5 but KL about 3e-4: kept, weight 0.5;
    # token 3: 0.5 vs 0.9, dropped (the other direction)
    weights, metrics = weights_of([0.5, 0.9, 0.001, 0.5], [0.5, 0.5, 0.002, 0.9], 2.0, kpop=0.1)
    assert 0.9 * math.log(1.8) + 0.1 * math.log(0.2) == pytest.approx(0.368, abs=1e-3)
    assert weights == pytest.approx([1.0, 0.0, 0.5, 0.0])
    assert metrics["rollout_corr/kpop_masked_fraction"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.5 / 4)


def test_kpop_keeps_a_token_of_probability_one():
    weights, _ = weights_of([1.0], [1.0], 2.0, kpop=0.1)
    assert weights == [1.0]


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["algorithm.rollout_is_threshold=abc"], "rollout_is_threshold", "lower_upper"),
        (["algorithm.rollout_is_threshold='5_0.5'"], "rollout_is_threshold", "lower bound"),
        (["algorithm.rollout_is_threshold='0_2'"], "rollout_is_threshold", "> 0"),
        (["algorithm.kpop_threshold=0.1"], "kpop_threshold", "rollout_is=token"),
        (["algorithm.rollout_is=token", "algorithm.kpop_threshold=-1"], "kpop_threshold", "> 0"),
    ],
)
def test_bad_masks_are_refused_in_one_line(recipe_from, overrides, key, says):
    with pytest.raises(RecipeError) as error:
        recipe_from(*overrides)
    message = one_line(error)
    assert f"algorithm.{key}" in message and says in message


def test_icepop_reads_from_a_recipe_as_verl_spells_it(recipe_from):
    recipe = recipe_from("algorithm.rollout_is=token", "algorithm.rollout_is_threshold=0.5_5.0")
    assert recipe.algorithm.rollout_is_threshold == "0.5_5.0"
    assert recipe_from("algorithm.rollout_is_threshold=3").algorithm.rollout_is_threshold == 3.0


# ------------------------------------------------------------------ the old_log_prob pass


class RecordingActor:
    """Answers compute_log_prob as a backend that computes sum_pi_squared does."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def compute_log_prob(self, batch, **options):
        self.calls.append(options)
        shape = batch["responses"].shape
        out = {"log_probs": torch.full(shape, -1.0), "entropys": torch.ones(shape)}
        if options.get("calculate_sum_pi_squared"):
            out["sum_pi_squared"] = torch.full(shape, 0.25)
        return out


@pytest.mark.parametrize(("estimator", "asked"), [(E.OptimalTokenBaseline, True), (E.GRPO, False)])
def test_the_old_log_prob_pass_asks_for_the_column_only_when_the_estimator_reads_it(
    estimator, asked
):
    from types import SimpleNamespace

    from plugrl.run.metrics import StepTimer
    from plugrl.run.steps import compute_old_log_probs

    actor = RecordingActor()
    parts = SimpleNamespace(actor=actor, estimator=estimator(AlgorithmConfig(), part_context()))
    batch = Batch({"responses": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)})
    compute_old_log_probs(parts, batch, StepTimer())
    # a backend without the column is never passed the keyword
    assert actor.calls == [
        {"calculate_entropy": True, "calculate_sum_pi_squared": True}
        if asked
        else {"calculate_entropy": True}
    ]
    assert ("sum_pi_squared" in batch) is asked
