import math
import multiprocessing
import pickle

import pytest
import torch

from plugrl.algorithms.objective import PolicyObjective
from plugrl.data.batch import Batch
from plugrl.errors import DataError, PluginError, RecipeError
from plugrl.parts.algorithm import LossScale

BASE = -1.0
# row 0: ratios 1.5 (A=+1, clipped to 1.28) and 1 (A=+1); row 1: ratio 1 (A=-1) then padding
LOG_PROB = [[BASE + math.log(1.5), BASE], [BASE, 3.0]]
ENTROPY = [[0.5, 0.7], [0.9, 100.0]]
PG_LOSS = (-1.28 - 1.0 + 1.0) / 3
ENTROPY_MEAN = (0.5 + 0.7 + 0.9) / 3
# log_prob - ref = 0.5, 0, -0.5 on the valid tokens; k3 = exp(-d) + d - 1
K3_MEAN = ((math.exp(-0.5) - 0.5) + 0.0 + (math.exp(0.5) - 1.5)) / 3


def micro_batch(**extra):
    log_prob = torch.tensor(LOG_PROB, dtype=torch.float64)
    tensors = {
        "old_log_probs": torch.full((2, 2), BASE),
        "advantages": torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
        "response_mask": torch.tensor([[1, 1], [1, 0]]),
        "ref_log_prob": log_prob - torch.tensor([[0.5, 0.0], [-0.5, 0.0]], dtype=torch.float64),
        **extra,
    }
    return Batch(tensors)


def run(objective, batch=None, entropy=None, scale=None):
    log_prob = torch.tensor(LOG_PROB, dtype=torch.float64, requires_grad=True)
    entropy_tensor = None if entropy is None else torch.tensor(entropy, dtype=torch.float64)
    loss, metrics = objective(
        batch or micro_batch(),
        log_prob,
        entropy_tensor,
        scale or LossScale(num_tokens=3, num_seqs=2),
    )
    (gradient,) = torch.autograd.grad(loss, log_prob)
    return float(loss.detach()), gradient, metrics


def test_policy_loss_only(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(
        recipe_from("actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.28"), plugins
    )
    assert not objective.needs_entropy and not objective.needs_ref
    loss, _, metrics = run(objective)
    assert loss == pytest.approx(PG_LOSS)
    assert metrics["actor/pg_loss"] == pytest.approx(PG_LOSS)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    assert "actor/kl_loss" not in metrics and "actor/entropy" not in metrics


def test_kl_loss_and_entropy_bonus(recipe_from, plugins):
    recipe = recipe_from(
        "actor.clip_ratio_low=0.2",
        "actor.clip_ratio_high=0.28",
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.1",
        "actor.kl_loss_type=k3",
        "actor.entropy_coeff=0.01",
    )
    objective = PolicyObjective.from_recipe(recipe, plugins)
    assert objective.needs_entropy and objective.needs_ref
    loss, _, metrics = run(objective, entropy=ENTROPY)
    assert loss == pytest.approx(PG_LOSS + 0.1 * K3_MEAN - 0.01 * ENTROPY_MEAN)
    assert metrics["actor/kl_loss"] == pytest.approx(K3_MEAN)
    assert metrics["actor/entropy"] == pytest.approx(ENTROPY_MEAN)


def test_entropy_is_reported_when_given_even_without_a_bonus(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from(), plugins)
    loss, _, metrics = run(objective, entropy=ENTROPY)
    assert metrics["actor/entropy"] == pytest.approx(ENTROPY_MEAN)
    assert loss == pytest.approx(metrics["actor/pg_loss"])


def test_terms_follow_the_loss_agg_mode(recipe_from, plugins):
    recipe = recipe_from(
        "actor.loss_agg_mode=seq-mean-token-sum",
        "actor.policy_loss=reinforce",
        "actor.use_kl_loss=true",
        "actor.kl_loss_type=kl",
        "actor.kl_loss_coef=1.0",
    )
    objective = PolicyObjective.from_recipe(recipe, plugins)
    loss, _, metrics = run(objective)
    # reinforce: -A * log_prob; row sums: -(2 * BASE + log 1.5), BASE; mean over 2 responses
    pg = (-(2 * BASE + math.log(1.5)) + BASE) / 2
    assert metrics["actor/pg_loss"] == pytest.approx(pg)
    assert metrics["actor/kl_loss"] == pytest.approx((0.5 + 0.0 - 0.5) / 2)
    assert loss == pytest.approx(pg)


def test_rollout_importance_weights_from_rollout_log_probs(recipe_from, plugins):
    recipe = recipe_from(
        "actor.clip_ratio_low=0.2",
        "actor.clip_ratio_high=0.28",
        "algorithm.rollout_is=token",
        "algorithm.rollout_is_threshold=2.0",
    )
    objective = PolicyObjective.from_recipe(recipe, plugins)
    # old / rollout ratios 3 (truncated to 2), 1, 0.5
    rollout = torch.tensor([[BASE - math.log(3.0), BASE], [BASE + math.log(2.0), 0.0]])
    loss, _, metrics = run(objective, micro_batch(rollout_log_probs=rollout))
    assert loss == pytest.approx((-1.28 * 2 - 1.0 + 0.5) / 3)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((2 + 1 + 0.5) / 3)


def test_icepop_and_kpop_masks_in_the_objective(recipe_from, plugins):
    recipe = recipe_from(
        "actor.clip_ratio_low=0.2",
        "actor.clip_ratio_high=0.28",
        "algorithm.rollout_is=token",
        "algorithm.rollout_is_threshold='0.5_2.5'",
        "algorithm.kpop_threshold=0.1",
    )
    objective = PolicyObjective.from_recipe(recipe, plugins)
    # old / rollout ratios 3 (outside IcePop's band: 0), 1, 1.2 on the valid tokens. KPop
    # drops the first too (probabilities 0.368 and 0.123: binary KL 0.197 > 0.1) and keeps the
    # third (0.368 and 0.307: 0.008)
    rollout = torch.tensor([[BASE - math.log(3.0), BASE], [BASE - math.log(1.2), 0.0]])
    loss, _, metrics = run(objective, micro_batch(rollout_log_probs=rollout))
    assert loss == pytest.approx((0.0 - 1.0 + 1.2) / 3)
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/kpop_masked_fraction"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((0 + 1 + 1.2) / 3)


def test_sequence_level_importance_weights(recipe_from, plugins):
    recipe = recipe_from("algorithm.rollout_is=sequence", "algorithm.rollout_is_threshold=5.0")
    objective = PolicyObjective.from_recipe(recipe, plugins)
    # row 0: product 3 * 1.5 = 4.5 (under 5); row 1: 0.5
    rollout = torch.tensor(
        [[BASE - math.log(3.0), BASE - math.log(1.5)], [BASE + math.log(2.0), 0]]
    )
    loss, _, _ = run(objective, micro_batch(rollout_log_probs=rollout))
    assert loss == pytest.approx((-1.2 * 4.5 - 1.0 * 4.5 + 1.0 * 0.5) / 3)


def test_precomputed_weights_win(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from("algorithm.rollout_is=token"), plugins)
    weights = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    loss, _, _ = run(objective, micro_batch(rollout_is_weights=weights))
    assert loss == pytest.approx((-2.0 + 1.0) / 3)


def test_rollout_is_without_rollout_log_probs_is_a_data_error(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from("algorithm.rollout_is=token"), plugins)
    with pytest.raises(DataError, match=r"algorithm.rollout_is is 'token' but the batch has no"):
        run(objective)


def test_kl_loss_without_reference_is_a_data_error(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from("actor.use_kl_loss=true"), plugins)
    batch = micro_batch()
    batch.pop("ref_log_prob")
    with pytest.raises(DataError, match=r"actor.use_kl_loss is true but the batch has no ref_log"):
        run(objective, batch)


def test_entropy_bonus_without_entropy_is_a_plugin_error(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from("actor.entropy_coeff=0.01"), plugins)
    with pytest.raises(PluginError, match=r"actor.entropy_coeff is 0.01 but the training backend"):
        run(objective)


def test_missing_columns_are_named(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from(), plugins)
    batch = micro_batch()
    batch.pop("advantages")
    with pytest.raises(KeyError, match="the actor objective needs batch columns advantages"):
        run(objective, batch)


def test_policy_loss_options_come_from_the_recipe(recipe_from, plugins):
    recipe = recipe_from("actor.policy_loss=kl_cov", "actor.policy_loss_args.kl_cov_ratio=0.5")
    objective = PolicyObjective.from_recipe(recipe, plugins)
    assert objective.policy_loss.options.kl_cov_ratio == 0.5


def test_bad_policy_loss_option_fails_when_the_recipe_is_read(recipe_from):
    with pytest.raises(RecipeError, match=r"actor.policy_loss_args"):
        recipe_from("actor.policy_loss=clip_cov", "actor.policy_loss_args.clip_cov_ration=0.5")
    with pytest.raises(RecipeError, match=r"'vanilla' takes no options, got clip_cov_ratio"):
        recipe_from("actor.policy_loss_args.clip_cov_ratio=0.5")


def test_pickles_without_its_parts_and_resolves_them_in_the_receiver(recipe_from, global_plugins):
    recipe = recipe_from("actor.use_kl_loss=true", "actor.kl_loss_type=low_var_kl+")
    objective = PolicyObjective.from_recipe(recipe, global_plugins)
    payload = pickle.dumps(objective)
    assert b"VanillaPPO" not in payload
    received = pickle.loads(payload)
    assert received.needs_ref and not received.needs_entropy
    with pytest.raises(ValueError) as error:
        run(received)  # parts are resolved from the receiver's plugins, not the sender's
    assert str(error.value) == (
        "a PolicyObjective resolves its policy loss from a plugin manager: build it with one, "
        "or attach() the process's before use"
    )
    received.attach(global_plugins)  # as a backend worker does with its own
    assert run(received)[0] == pytest.approx(run(objective)[0])


def test_metrics_are_shares_of_the_mini_batch(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(
        recipe_from("actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.28"), plugins
    )
    whole = run(objective, entropy=ENTROPY)[2]
    scale = LossScale(num_tokens=3, num_seqs=2)
    log_prob = torch.tensor(LOG_PROB, dtype=torch.float64)
    entropy = torch.tensor(ENTROPY, dtype=torch.float64)
    parts = [
        objective(
            micro_batch().select([row]), log_prob[row : row + 1], entropy[row : row + 1], scale
        )[1]
        for row in (0, 1)
    ]
    for name, value in whole.items():
        assert parts[0][name] + parts[1][name] == pytest.approx(value), name


def _loss_in_a_fresh_process(payload: bytes) -> float:
    from plugrl.cluster.worker import worker_plugin_manager

    objective = pickle.loads(payload)
    objective.attach(worker_plugin_manager())  # what a backend worker does when it starts
    return run(objective)[0]


def test_objective_resolves_its_parts_in_a_fresh_process(recipe_from, plugins):
    # a spawned process has only the installed entry points, like a Ray worker
    recipe = recipe_from("actor.use_kl_loss=true", "actor.kl_loss_type=k3+", "actor.clip_ratio=0.3")
    objective = PolicyObjective.from_recipe(recipe, plugins)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        remote = pool.apply(_loss_in_a_fresh_process, (pickle.dumps(objective),))
    assert remote == pytest.approx(run(objective)[0])


# ---------------------------------------------------------------- rows without a gradient


def zero_row_batch():
    # row 1's advantages are zero on its valid token and non-zero on its padding only
    return micro_batch(advantages=torch.tensor([[1.0, 1.0], [0.0, 5.0]]))


def test_rows_with_all_zero_advantages_have_no_gradient(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from(), plugins)
    assert objective.rows_without_gradient(zero_row_batch()).tolist() == [False, True]
    # and indeed: the loss's gradient is zero on every token of that row
    _, gradient, _ = run(objective, zero_row_batch())
    assert gradient[1].abs().max() == 0.0 and gradient[0, 1] != 0.0


@pytest.mark.parametrize(
    "overrides",
    [
        ("actor.skip_zero_advantage_rows=false",),
        ("actor.entropy_coeff=0.01",),
        ("actor.use_kl_loss=true",),
        ("actor.policy_loss=clip_cov",),
        ("actor.policy_loss=kl_cov",),
    ],
    ids=["option off", "entropy bonus", "kl loss", "clip_cov", "kl_cov"],
)
def test_nothing_is_skipped_when_a_zero_advantage_row_still_has_a_loss(
    recipe_from, plugins, overrides
):
    objective = PolicyObjective.from_recipe(recipe_from(*overrides), plugins)
    assert objective.rows_without_gradient(zero_row_batch()) is None


@pytest.mark.parametrize("loss", ["vanilla", "gspo", "geo_mean", "cispo", "reinforce", "sapo"])
def test_losses_that_vanish_with_the_advantage_say_so(recipe_from, plugins, loss):
    objective = PolicyObjective.from_recipe(recipe_from(f"actor.policy_loss={loss}"), plugins)
    assert objective.rows_without_gradient(zero_row_batch()).tolist() == [False, True]
    _, gradient, _ = run(objective, zero_row_batch())
    assert gradient[1].abs().max() == 0.0


def test_metrics_average_over_the_rows_the_backend_ran(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from(), plugins)
    full = LossScale(num_tokens=3, num_seqs=2)
    ran = LossScale(num_tokens=2, num_seqs=1)
    entropy = [[0.5, 0.7], [0.9, 100.0]]
    only_row_0 = zero_row_batch().select([0])
    log_prob = torch.tensor([LOG_PROB[0]], dtype=torch.float64, requires_grad=True)
    loss, metrics = objective(
        only_row_0,
        log_prob,
        torch.tensor([entropy[0]], dtype=torch.float64),
        LossScale(num_tokens=3, num_seqs=2, metric_scale=ran),
    )
    loss_full, _ = objective(
        only_row_0, log_prob, torch.tensor([entropy[0]], dtype=torch.float64), full
    )
    # the loss keeps the whole mini-batch's normaliser, the metrics the rows that ran
    assert float(loss.detach()) == pytest.approx(float(loss_full.detach()))
    assert metrics["actor/entropy"] == pytest.approx((0.5 + 0.7) / 2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 2)
