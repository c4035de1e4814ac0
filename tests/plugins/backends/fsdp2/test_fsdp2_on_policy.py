"""An exactly on-policy update takes old log-probs from its own forward, and must then do
what the update after a separate old-log-prob pass does."""

import pytest

from plugrl.algorithms.objective import PolicyObjective
from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
)


def _two_ways(model_dir, **actor):
    """The same single-step update, once after compute_log_prob and once without it."""
    recipe = make_recipe(model_dir, **actor)
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    batch = make_batch(8)
    batch.pop("old_log_probs")

    recomputed = make_backend(recipe)
    computed = recomputed.compute_log_prob(batch, calculate_entropy=True)
    with_old = batch.copy()
    with_old["old_log_probs"] = computed["log_probs"]
    recomputed_metrics = recomputed.update_policy(with_old, objective)

    derived = make_backend(recipe)
    derived_metrics = derived.update_policy(batch.copy(), objective)
    return (recomputed, recomputed_metrics, computed), (derived, derived_metrics)


@pytest.mark.parametrize(
    "actor",
    [
        {},
        {"ppo_micro_batch_size_per_gpu": 3},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24},
        {"entropy_coeff": 0.01},
    ],
    ids=["whole", "micro-batches", "dynamic-bsz", "entropy-bonus"],
)
def test_derived_old_log_probs_give_the_same_update(tiny_model, actor):
    (recomputed, recomputed_metrics, _), (derived, derived_metrics) = _two_ways(tiny_model, **actor)
    before, after = full_weights(recomputed), full_weights(derived)
    assert max((before[name] - after[name]).abs().max().item() for name in before) < 2e-6
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/loss"):
        assert derived_metrics[name] == pytest.approx(recomputed_metrics[name], rel=1e-5)
    # the ratio is exactly one: nothing clips and the policies agree
    assert derived_metrics["actor/ppo_kl"] == 0.0
    assert derived_metrics["actor/pg_clipfrac"] == 0.0


def test_derived_update_reports_the_entropy_the_skipped_pass_gave(tiny_model):
    (_, _, computed), (_, derived_metrics) = _two_ways(tiny_model, ppo_micro_batch_size_per_gpu=3)
    mask = make_batch(8)["response_mask"].bool()
    token_mean = computed["entropys"][mask].mean().item()
    assert derived_metrics["actor/entropy"] == pytest.approx(token_mean, rel=1e-5)


@pytest.mark.parametrize(
    ("actor", "why"),
    [
        ({"ppo_epochs": 2}, "ppo_epochs 2"),
        ({"ppo_mini_batch_size": 4}, "8 sequences on this rank in mini-batches of 4"),
    ],
)
def test_more_than_one_optimizer_step_needs_old_log_probs(tiny_model, actor, why):
    recipe = make_recipe(tiny_model, **actor)
    batch = make_batch(8)
    batch.pop("old_log_probs")
    with pytest.raises(RecipeError, match=why) as info:
        make_backend(recipe).update_policy(
            batch, PolicyObjective.from_recipe(recipe, get_plugin_manager())
        )
    assert "compute_log_prob first" in str(info.value)
