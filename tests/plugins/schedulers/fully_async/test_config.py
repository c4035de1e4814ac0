"""The fully_async section's keys: values a run of a given length makes meaningless are warned
about, one line each on the ``plugrl.recipe`` logger."""

from __future__ import annotations

import logging

import pytest

from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import load_recipe
from plugrl_fully_async.config import FullyAsyncConfig, warn_meaningless_bounds

# required_samples = actor.ppo_mini_batch_size 4 x scheduler.require_batches 1
ASYNC = ["scheduler=fully_async", "rollout.colocate=false", "actor.ppo_mini_batch_size=4"]
ASYNC += ["data.train_batch_size=4"]


def warnings_of(caplog, overrides, total_steps, dataset_size=None) -> list[str]:
    recipe = load_recipe(None, [*ASYNC, *overrides], get_plugin_manager())
    assert isinstance(recipe.scheduler, FullyAsyncConfig)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="plugrl.recipe"):
        warn_meaningless_bounds(recipe.scheduler, recipe, total_steps, dataset_size)
    return [r.getMessage() for r in caplog.records if r.name == "plugrl.recipe"]


def test_bounds_that_hold_give_no_warning(caplog, plugrl_plugin_manager):
    # max_required_samples int(4 x 1.5 x 2) = 12 of a run of 10 steps x 4 = 40 samples
    overrides = ["scheduler.staleness_threshold=0.5", "scheduler.trigger_parameter_sync_step=2"]
    assert warnings_of(caplog, overrides, total_steps=10, dataset_size=100) == []
    # one step trains what the initial weights generated, whatever the keys
    overrides = ["scheduler.staleness_threshold=1e30", "scheduler.trigger_parameter_sync_step=9"]
    assert warnings_of(caplog, overrides, total_steps=1) == []


def test_a_staleness_threshold_beyond_the_whole_run_warns(caplog, plugrl_plugin_manager):
    assert warnings_of(caplog, ["scheduler.staleness_threshold=1e30"], total_steps=10) == [
        "scheduler.staleness_threshold: 1e+30 lets max_required_samples = int(required_samples "
        "4 x (1 + 1e+30) x trigger_parameter_sync_step 1) = 4e+30 exceed the 40 samples the "
        "whole run trains (10 steps x required_samples 4), so the bound never pauses the "
        "rollouter and samples may train on weights many versions old; lower it for the bound "
        "to hold"
    ]
    # int(4 x 11 x 1) = 44 > 40: just past the run
    assert warnings_of(caplog, ["scheduler.staleness_threshold=10"], total_steps=10) == [
        "scheduler.staleness_threshold: 10 lets max_required_samples = int(required_samples 4 "
        "x (1 + 10) x trigger_parameter_sync_step 1) = 44 exceed the 40 samples the whole run "
        "trains (10 steps x required_samples 4), so the bound never pauses the rollouter and "
        "samples may train on weights many versions old; lower it for the bound to hold"
    ]
    # int(4 x 10 x 1) = 40: the bound may still pause the rollouter
    assert warnings_of(caplog, ["scheduler.staleness_threshold=9"], total_steps=10) == []


def test_a_staleness_threshold_beyond_the_dataset_warns(caplog, plugrl_plugin_manager):
    overrides = ["scheduler.staleness_threshold=4"]  # int(4 x 5 x 1) = 20
    assert warnings_of(caplog, overrides, total_steps=100, dataset_size=16) == [
        "scheduler.staleness_threshold: 4 lets max_required_samples = int(required_samples 4 x "
        "(1 + 4) x trigger_parameter_sync_step 1) = 20 exceed the 16 prompts of the training "
        "data, so the bound never pauses the rollouter and samples may train on weights many "
        "versions old; lower it for the bound to hold"
    ]
    assert warnings_of(caplog, overrides, total_steps=100, dataset_size=20) == []


def test_a_threshold_too_large_for_a_float_product_still_warns(caplog, plugrl_plugin_manager):
    (message,) = warnings_of(caplog, ["scheduler.staleness_threshold=1e308"], total_steps=10)
    assert "x (1 + 1e+308) x trigger_parameter_sync_step 1) = inf exceed the 40 samples" in (
        message
    )


def test_a_sync_step_at_or_past_the_last_step_warns(caplog, plugrl_plugin_manager):
    expected = (
        "scheduler.trigger_parameter_sync_step: {k} is not below the run's 8 trainer steps, so "
        "no weight sync comes before the last step and the engines generate every sample with "
        "the initial weights; set it below 8"
    )
    for sync_step in (1000000, 8):
        # a period as long as the run is the sync step's doing: the threshold (0.1) is not
        # blamed too
        overrides = [f"scheduler.trigger_parameter_sync_step={sync_step}"]
        assert warnings_of(caplog, overrides, total_steps=8) == [expected.format(k=sync_step)]
    assert (
        warnings_of(
            caplog,
            ["scheduler.trigger_parameter_sync_step=7", "scheduler.staleness_threshold=0"],
            total_steps=8,
        )
        == []
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_thresholds_are_refused_when_the_recipe_is_read(plugrl_plugin_manager, value):
    with pytest.raises(RecipeError) as info:
        load_recipe(None, [*ASYNC, f"scheduler.staleness_threshold={value}"], get_plugin_manager())
    assert str(info.value) == (
        f"scheduler.staleness_threshold: expected a finite number, got {value}"
    )


def test_a_run_warns_of_a_meaningless_bound_when_it_starts(
    sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, caplog
):
    """The scheduler checks its bounds once the run's length and data are known, and the run
    goes on under the unbounded rollouter."""
    import logging

    from plugrl.run.runner import run_recipe
    from plugrl_sim.parts import sim_recipe

    data = sim_recipe(sim_task, tmp_path / "run", scheduler="fully_async", colocate=False, steps=2)
    data["scheduler"]["staleness_threshold"] = 1e308
    with caplog.at_level(logging.WARNING, logger="plugrl.recipe"):
        run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    warned = [r.getMessage() for r in caplog.records if r.name == "plugrl.recipe"]
    assert any(line.startswith("scheduler.staleness_threshold: ") for line in warned), warned
    assert (tmp_path / "run" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


@pytest.mark.parametrize(
    "value, bound", [(None, None), ("null", None), ("auto", "auto"), ("1", 1), ("3", 3)]
)
def test_the_strict_lag_bound_is_off_auto_or_a_number_of_versions(
    plugrl_plugin_manager, value, bound
):
    overrides = [] if value is None else [f"scheduler.max_version_lag={value}"]
    recipe = load_recipe(None, [*ASYNC, *overrides], get_plugin_manager())
    assert recipe.scheduler.max_version_lag == bound


@pytest.mark.parametrize(
    "value, shown", [("-1", "-1"), ("0", "0"), ("soon", "'soon'"), ("1.5", "1.5"), ("true", "True")]
)
def test_a_strict_lag_bound_of_another_value_is_refused_in_one_line(
    plugrl_plugin_manager, value, shown
):
    with pytest.raises(RecipeError) as info:
        load_recipe(None, [*ASYNC, f"scheduler.max_version_lag={value}"], get_plugin_manager())
    assert str(info.value) == (
        "scheduler.max_version_lag: must be null (off), auto or a number of weight versions "
        f"of 1 or more, got {shown}"
    )
