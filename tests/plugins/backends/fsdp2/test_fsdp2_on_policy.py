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


def _agent_batch(rows):
    """``rows`` rows of agent trajectories: eight samples, some of them several sequences."""
    batch = make_batch(rows)
    batch.pop("old_log_probs")
    batch["sample_last"] = [True] * rows
    return batch


@pytest.mark.parametrize("rows", [13, 16, 5])
def test_samples_of_several_rows_train_in_the_steps_the_recipe_asks(tiny_model, rows):
    """An OpenAI-endpoint agent whose calls do not extend each other makes more rows than
    train_batch_size x n: the update is still one optimizer step over all of them, its old
    log-probs from its own forward, and does what the update after the separate pass does
    (the fourth drill: it stopped naming actor.reuse_on_policy_log_prob)."""
    import attrs

    recipe = make_recipe(tiny_model)  # ppo_mini_batch_size 8
    recipe = attrs.evolve(recipe, data=attrs.evolve(recipe.data, train_batch_size=8))
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    batch = _agent_batch(rows)

    recomputed = make_backend(recipe)
    with_old = batch.copy()
    with_old["old_log_probs"] = recomputed.compute_log_prob(batch)["log_probs"]
    recomputed_metrics = recomputed.update_policy(with_old, objective)
    derived = make_backend(recipe)
    derived_metrics = derived.update_policy(batch.copy(), objective)

    before, after = full_weights(recomputed), full_weights(derived)
    assert max((before[name] - after[name]).abs().max().item() for name in before) < 2e-6
    assert derived_metrics["actor/pg_loss"] == pytest.approx(
        recomputed_metrics["actor/pg_loss"], rel=1e-5
    )
    assert recomputed.update_steps == derived.update_steps == 1


def test_samples_of_several_rows_take_as_many_optimizer_steps_as_the_recipe(tiny_model):
    import attrs

    recipe = make_recipe(tiny_model, ppo_mini_batch_size=4)  # two optimizer steps a batch
    recipe = attrs.evolve(recipe, data=attrs.evolve(recipe.data, train_batch_size=8))
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    batch = _agent_batch(13)
    backend = make_backend(recipe)
    batch["old_log_probs"] = backend.compute_log_prob(batch)["log_probs"]
    steps = []
    original = backend.optimizer.step

    def counting_step(*args, **kwargs):
        steps.append(1)
        return original(*args, **kwargs)

    backend.optimizer.step = counting_step
    backend.update_policy(batch, objective)
    assert len(steps) == 2
