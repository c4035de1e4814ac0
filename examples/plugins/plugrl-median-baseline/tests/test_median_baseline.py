"""Tests of plugrl-median-baseline, run against the installed package with plugrl's test kit:
``pip install .`` then ``pytest`` in this folder."""

import pytest
import torch

import plugrl_median_baseline
from plugrl.algorithms.objective import PolicyObjective
from plugrl.errors import RecipeError
from plugrl.plugin.build import build_estimator, build_policy_loss
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import explain
from plugrl.testing import make_batch, make_loss_aggregator, part_context
from plugrl_median_baseline.estimator import MedianBaseline
from plugrl_median_baseline.loss import RobustPPO
from plugrl_median_baseline.options import RobustPPOConfig


def test_the_installed_package_registers_both_parts(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(plugrl_median_baseline)
    row = next(r for r in plugrl_plugin_manager.describe() if r["name"] == "median_baseline")
    assert row["distribution"] == "plugrl-median-baseline"
    assert plugrl_plugin_manager.registry("advantage_estimators").load("median_baseline") is (
        MedianBaseline
    )
    assert plugrl_plugin_manager.registry("policy_losses").load("robust_ppo") is RobustPPO


# ------------------------------------------------------------------------------ the estimator


def test_advantages_are_the_score_minus_the_group_median(plugrl_recipe):
    recipe = plugrl_recipe({"algorithm.adv_estimator": "median_baseline", "rollout.n": 3})
    batch = make_batch((4, 2), [3, 2, 1, 2, 2, 2], n=3, scores=[1, 0, 4, 2, 2, 2])
    advantages, returns = build_estimator(recipe, get_plugin_manager()).compute(batch)
    # group 0: scores 1, 0, 4, median 1; group 1: all 2
    assert advantages.tolist() == [
        [0.0, 0.0, 0.0],
        [-1.0, -1.0, 0.0],
        [3.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    assert torch.equal(returns, advantages)


def test_scale_by_mad_from_the_recipe(plugrl_recipe):
    recipe = plugrl_recipe(
        {
            "algorithm": {
                "adv_estimator": "median_baseline",
                "adv_estimator_args": {"scale_by_mad": True, "eps": 0.5},
            }
        }
    )
    batch = make_batch((3,), [2, 2, 2], n=3, scores=[1, 0, 4])
    advantages, _ = build_estimator(recipe, get_plugin_manager()).compute(batch)
    # deviations from the median 1: 0, 1, 3 -> MAD 1
    assert advantages[:, 0].tolist() == pytest.approx([0.0, -1 / 1.5, 3 / 1.5])


def test_without_options_the_estimator_uses_the_defaults():
    estimator = MedianBaseline(part_context().recipe.algorithm, part_context())
    batch = make_batch((2,), [1, 1], n=2, scores=[3.0, 1.0])
    assert estimator.compute(batch)[0][:, 0].tolist() == [1.0, -1.0]


# ------------------------------------------------------------------------------ the loss


def robust_loss(recipe, batch, rows, log_prob, advantages=None):
    loss = build_policy_loss(recipe, get_plugin_manager())
    micro = batch.select(rows)
    return loss(
        old_log_prob=micro["old_log_probs"],
        log_prob=log_prob[rows],
        advantages=micro["advantages"] if advantages is None else advantages[rows],
        response_mask=micro["response_mask"],
        aggregate=make_loss_aggregator(batch, recipe=recipe),
    )


def test_advantages_beyond_the_bound_count_as_the_bound(plugrl_recipe):
    recipe = plugrl_recipe(
        {"actor.policy_loss": "robust_ppo", "actor.policy_loss_args.max_advantage": 1.0}
    )
    batch = make_batch((2, 3), [2, 3, 1, 2], advantages=[5.0, -0.5, -7.0, 1.0], log_probs=True)
    log_prob = batch["old_log_probs"] + 0.05 * batch["response_mask"]
    rows = [0, 1, 2, 3]
    loss, metrics = robust_loss(recipe, batch, rows, log_prob)
    bounded = batch["advantages"].clamp(-1, 1)
    same, _ = robust_loss(recipe, batch, rows, log_prob, advantages=bounded)
    assert float(loss) == pytest.approx(float(same))
    assert metrics["actor/adv_clipfrac"] == pytest.approx(3 / 8)  # rows 0 and 2: 2 + 1 tokens
    assert set(metrics) >= {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_loss_is_exact_over_any_micro_batch_split(plugrl_recipe, mode):
    recipe = plugrl_recipe({"actor": {"policy_loss": "robust_ppo", "loss_agg_mode": mode}})
    batch = make_batch((2, 3, 1), [4, 1, 3, 2, 0, 4], advantages=[1, -2, 4, 0.5, 1, -1])
    batch["old_log_probs"] = batch["rollout_log_probs"]
    log_prob = batch["old_log_probs"] + 0.3 * torch.randn(6, 4) * batch["response_mask"]
    whole, _ = robust_loss(recipe, batch, list(range(6)), log_prob)
    parts = [robust_loss(recipe, batch, rows, log_prob)[0] for rows in ([0, 1], [2], [3, 4, 5])]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-5)


def test_dual_clip_can_be_turned_off(plugrl_recipe):
    batch = make_batch((2,), [1], n=1, advantages=[-1.0], log_probs=True)
    log_prob = batch["old_log_probs"] + 3.0  # ratio e^3: far beyond clip_ratio_c = 3
    losses = {}
    for dual_clip in (True, False):
        recipe = plugrl_recipe(
            {"actor.policy_loss": "robust_ppo", "actor.policy_loss_args.dual_clip": dual_clip}
        )
        losses[dual_clip], metrics = robust_loss(recipe, batch, [0], log_prob)
        assert metrics["actor/pg_clipfrac_lower"] == (1.0 if dual_clip else 0.0)
    assert float(losses[True]) == pytest.approx(3.0)
    assert float(losses[False]) == pytest.approx(torch.e**3, rel=1e-4)


def test_the_objective_uses_the_loss_and_its_options(plugrl_recipe):
    recipe = plugrl_recipe(
        {
            "actor": {
                "policy_loss": "robust_ppo",
                "policy_loss_args": {"max_advantage": 2.0},
                "loss_agg_mode": "token-mean",
            }
        }
    )
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    assert isinstance(objective.policy_loss, RobustPPO)
    assert objective.policy_loss.options == RobustPPOConfig(max_advantage=2.0)
    batch = make_batch((3, 3), [2, 2, 2, 2], advantages=[10.0, -1.0, 0.0, 1.0], log_probs=True)
    log_prob = batch["old_log_probs"].clone().requires_grad_(True)
    scale = make_loss_aggregator(batch, recipe=recipe).scale
    loss, metrics = objective(batch, log_prob, None, scale)
    loss.backward()
    # ratio 1: gradient -A / num_tokens with A clipped to 2
    expected = -torch.tensor([2.0, -1.0, 0.0, 1.0]).unsqueeze(-1).expand(4, 2) / 8
    assert torch.allclose(log_prob.grad, expected)
    assert metrics["actor/adv_clipfrac"] == pytest.approx(2 / 8)


# ------------------------------------------------------------------------------ the options


def test_explain_describes_the_loss_options(plugrl_plugin_manager):
    info = explain("actor.policy_loss_args.max_advantage", plugrl_plugin_manager)
    assert (info.type, info.default) == ("float", 3.0)
    assert info.help.startswith("Advantages are clipped to [-max_advantage, max_advantage]")
    assert info.owner == "policy loss robust_ppo (median_baseline)"


def test_a_bad_option_is_one_line_naming_the_key(plugrl_recipe):
    with pytest.raises(RecipeError) as info:
        plugrl_recipe(
            {"actor.policy_loss": "robust_ppo", "actor.policy_loss_args.max_advantage": 0}
        )
    assert str(info.value) == "actor.policy_loss_args.max_advantage: must be > 0, got 0.0"
