"""The weight-sync checks on tiny-model runs: verl's rollout-versus-trainer metrics in a normal
run, and each planted fault (an engine that keeps its old weights, one that skips a tensor,
one that stalls in a transfer) caught within a step in one line naming the engine."""

from __future__ import annotations

import json
import logging

import pytest

from plugrl.errors import PluginError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.runner import run_recipe
from tests.e2e.e2e_support import tiny_recipe
from tests.weight_sync_faults import SKIPPED_WEIGHT, FaultyEngines, StallingEngine

pytestmark = pytest.mark.slow

PROBS = ("mean", "max", "std")


@pytest.fixture
def faulty(plugrl_register_plugin):
    plugrl_register_plugin(FaultyEngines(), "faulty-engines")
    return get_plugin_manager()


def _run(task, folder, plugins, *, engine, trainer=None, rollout=None):
    run_dir = folder / "run"
    data = tiny_recipe(
        task,
        run_dir,
        rollout={"n": 2, "engine": engine, "dtype": "float32", **(rollout or {})},
        trainer={
            "total_training_steps": 2,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "seed": 7,
            **(trainer or {}),
        },
    )
    run_recipe(build_recipe(data, plugins), plugins)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record for record in map(json.loads, lines)}


def test_a_run_logs_how_far_the_engine_is_from_the_trainer_and_verifies_its_weights(
    tiny_task, tmp_path, faulty, caplog
):
    # the engine's own weights, pushed through the transport and read back after each sync
    with caplog.at_level(logging.WARNING, logger="plugrl"):
        steps = _run(
            tiny_task,
            tmp_path,
            faulty,
            engine="hf-transported",
            trainer={"verify_weight_sync": True, "check_weight_sync": "error"},
        )
    for step in (1, 2):
        metrics = steps[step]
        assert metrics["training/rollout_probs_diff_valid"] == 1
        for name in PROBS:
            assert 0 <= metrics[f"training/rollout_probs_diff_{name}"] < 1e-6, (name, metrics)
        assert metrics["training/rollout_actor_probs_pearson_corr"] > 0.999
        # every weight of the tiny model compared after the step's sync
        assert metrics["training/weight_sync_verified_weights"] > 10
    assert not [r for r in caplog.records if "weight sync" in r.getMessage()]


def test_an_engine_that_keeps_its_old_weights_warns_at_the_first_step_after_an_update(
    tiny_task, tmp_path, faulty, caplog
):
    with caplog.at_level(logging.WARNING, logger="plugrl"):
        steps = _run(tiny_task, tmp_path, faulty, engine="hf-stale")
    # step 1 samples with the starting weights, which the engine has; step 2 after an update
    assert steps[1]["training/rollout_probs_diff_mean"] < 1e-6
    assert steps[2]["training/rollout_probs_diff_mean"] > 1e-4
    warnings = [r.getMessage() for r in caplog.records if "weight sync check" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "rollout engine 'hf-stale' (float32) sampled at weight version 1" in warnings[0]
    assert "\n" not in warnings[0]


def test_check_weight_sync_error_stops_the_run_with_that_line(tiny_task, tmp_path, faulty):
    with pytest.raises(PluginError, match=r"weight sync check: rollout engine 'hf-stale'") as info:
        _run(tiny_task, tmp_path, faulty, engine="hf-stale", trainer={"check_weight_sync": "error"})
    assert "trainer.weight_sync_thresholds.float32" in str(info.value)


def test_verify_weight_sync_names_the_engine_and_the_weight_it_kept_old(
    tiny_task, tmp_path, faulty
):
    with pytest.raises(PluginError) as info:
        _run(
            tiny_task,
            tmp_path,
            faulty,
            engine="hf-stale",
            trainer={"verify_weight_sync": True, "check_weight_sync": "off"},
        )
    line = str(info.value)
    assert line.startswith("weight sync check: engine worker 0 (rollout engine 'hf-stale')")
    assert "after the sync to version 1" in line  # the first sync after an update
    assert "\n" not in line


def test_verify_weight_sync_names_a_skipped_tensor(tiny_task, tmp_path, faulty):
    with pytest.raises(PluginError) as info:
        _run(
            tiny_task,
            tmp_path,
            faulty,
            engine="hf-skipping",
            trainer={"verify_weight_sync": True, "check_weight_sync": "off"},
        )
    line = str(info.value)
    assert "engine worker 0 (rollout engine 'hf-skipping')" in line
    assert f"{SKIPPED_WEIGHT} (" in line
    assert "after the sync to version 1" in line
    assert " more" not in line  # that weight only


def test_a_stalled_transfer_ends_in_one_line_naming_the_engine(tiny_task, tmp_path, faulty):
    StallingEngine.updates = 0
    with pytest.raises(PluginError) as info:
        _run(
            tiny_task,
            tmp_path,
            faulty,
            engine="hf-stalling",
            rollout={"update_weights_timeout_s": 2},
        )
    assert str(info.value) == (
        "weight sync stalled: engine worker 0 (rollout engine 'hf-stalling') did not finish "
        "load_weights within 2 s (rollout.update_weights_timeout_s); see that engine's log "
        "(is it alive, is its device busy?), or raise the timeout"
    )


@pytest.mark.parametrize("engine", ["hf-transported", "hf-stale"])
def test_a_lora_run_verifies_the_merged_weights(tiny_task, tmp_path, faulty, engine):
    lora = {**tiny_recipe(tiny_task, tmp_path)["model"], "lora_rank": 8, "lora_alpha": 16}

    def run():
        data = tiny_recipe(
            tiny_task,
            tmp_path / "run",
            model=lora,
            rollout={"n": 2, "engine": engine, "dtype": "float32"},
            trainer={
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path / "run"),
                "logger": ["jsonl"],
                "verify_weight_sync": True,
                "check_weight_sync": "off",
            },
        )
        return run_recipe(build_recipe(data, faulty), faulty)

    if engine == "hf-transported":
        assert run()["training/weight_sync_verified_weights"] > 10
    else:
        # the adapters moved the merged weights at the first update; the engine kept the base
        with pytest.raises(PluginError, match=r"engine worker 0 \(rollout engine 'hf-stale'\)"):
            run()


def test_an_update_that_derives_the_old_log_probs_compares_the_engine_in_its_forward(
    tiny_task, tmp_path, faulty, caplog
):
    # one optimizer step over the whole batch: no separate old_log_prob pass runs
    one_step = {"ppo_mini_batch_size": 4, "optim": {"lr": 1e-3}}

    def run(engine):
        data = tiny_recipe(
            tiny_task,
            tmp_path / engine,
            actor=one_step,
            rollout={"n": 2, "engine": engine, "dtype": "float32"},
            trainer={
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path / engine),
                "logger": ["jsonl"],
            },
        )
        recipe = build_recipe(data, faulty)
        run_recipe(recipe, faulty)
        lines = (tmp_path / engine / "metrics.jsonl").read_text().splitlines()
        return {record["step"]: record for record in map(json.loads, lines)}

    with caplog.at_level(logging.WARNING, logger="plugrl"):
        synced = run("hf-transported")
        assert not [r for r in caplog.records if "weight sync check" in r.getMessage()]
        stale = run("hf-stale")
    assert "timing_s/old_log_prob" not in synced[2]  # the pass was skipped
    assert synced[1]["training/rollout_probs_diff_mean"] < 1e-6
    assert synced[2]["training/rollout_probs_diff_mean"] < 1e-6
    assert stale[2]["training/rollout_probs_diff_mean"] > 1e-4
    warnings = [r.getMessage() for r in caplog.records if "weight sync check" in r.getMessage()]
    assert len(warnings) == 1 and "'hf-stale'" in warnings[0], warnings
