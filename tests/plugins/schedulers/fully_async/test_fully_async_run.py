"""The tiny model trained under ``scheduler: fully_async``: in one process with threads, killed
with -9 and resumed, and on Ray with the engine in a worker of its own that gets killed."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest
from click.testing import CliRunner

from plugrl_fully_async.rollouter import Rollouter
from plugrl_tools.cli import cli
from tests.e2e.e2e_support import (
    background_run,
    by_step,
    check_ok,
    read_records,
    run_cli,
    sigterm_after_step,
    tiny_recipe,
    wait_for_step,
    write_recipe,
)

pytestmark = pytest.mark.slow

REQUIRED = 2  # actor.ppo_mini_batch_size of tiny_recipe, require_batches 1
CONTRACT = (
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/wall_clock_s",
    "timing_s/step",
    "timing_s/gen",
    "critic/score/mean",
    "training/global_step",
    "fully_async/count/staleness_samples",
    "fully_async/count/current_param_version",
    "fully_async/count/total_generated_samples",
    "fully_async/count/dropped_stale_samples",
    "fully_async/count/pauses",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio",
    "fully_async/monitor/generated_tokens_per_s",
    "fully_async/monitor/max_version_lag",
    "fully_async/partial/samples",
    "fully_async/partial/max_version_span",
)


def async_recipe(tiny_task, folder, steps, **scheduler):
    recipe = tiny_recipe(
        tiny_task,
        folder / "run",
        data={"max_response_length": 24},
        rollout={"n": 2, "colocate": False},
        algorithm={"adv_estimator": "grpo", "rollout_is": "token", "rollout_is_threshold": 2.0},
        scheduler={"name": "fully_async", **scheduler},
        trainer={"total_training_steps": steps, "save_freq": 1, "test_freq": 0},
    )
    return write_recipe(folder / "recipe.yaml", recipe)


def weight_periods(steps, sync_every, resumed_at=0):
    """The version each step ends with and the steps that sync: every ``sync_every`` steps,
    and a resume between two syncs pushes a new version and starts a period."""
    versions, syncs = {}, set()
    version = since_sync = 0
    for step in range(1, steps + 1):
        if step == resumed_at + 1 and since_sync:
            version, since_sync = version + 1, 0
        since_sync += 1
        if since_sync == sync_every:
            version, since_sync = version + 1, 0
            syncs.add(step)
        versions[step] = version
    return versions, syncs


def check_steps(records, steps, *, sync_every=1, resumed_at=0, strict=False):
    """Every step logged once, with the contract's metrics; within the bound under the strict
    one (``scheduler.max_version_lag``), nothing dropped under verl's rule."""
    assert sorted(records) == list(range(steps + 1))
    versions, syncs = weight_periods(steps, sync_every, resumed_at)
    generated = 0
    wall_clock = 0.0
    for step in range(1, steps + 1):
        record = records[step]
        missing = [name for name in CONTRACT if name not in record]
        assert not missing, f"step {step} lacks {missing}"
        assert record["training/global_step"] == step
        assert ("timing_s/param_sync" in record) == (step in syncs)
        assert record["fully_async/count/current_param_version"] == versions[step]
        lag = record["fully_async/monitor/max_version_lag"]
        assert 0 <= record["fully_async/monitor/mean_version_lag"] <= lag
        if strict:
            assert lag <= record["fully_async/monitor/version_lag_bound"]
        else:
            assert "fully_async/monitor/version_lag_bound" not in record
            assert record["fully_async/count/dropped_stale_samples"] == 0
        # cumulative counters never restart, not even across a resume
        assert record["fully_async/count/total_generated_samples"] >= max(generated, step * 2)
        generated = record["fully_async/count/total_generated_samples"]
        assert record["perf/wall_clock_s"] > wall_clock
        wall_clock = record["perf/wall_clock_s"]
        assert record["perf/total_num_tokens"] > 0
    return records


def test_a_local_run_overlaps_stays_within_the_bound_and_trains_each_sample_once(
    tiny_task, tmp_path, monkeypatch
):
    taken = []
    take = Rollouter.take

    def recording(self, count):
        samples, dropped = take(self, count)
        taken.extend((sample.sample_id, sample.key) for sample in samples)
        return samples, dropped

    monkeypatch.setattr(Rollouter, "take", recording)
    recipe = async_recipe(tiny_task, tmp_path, steps=4, staleness_threshold=1.0)
    result = CliRunner().invoke(cli, ["run", str(recipe)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = check_steps(by_step(read_records(tmp_path / "run")), 4)
    assert len(taken) == 4 * REQUIRED
    assert len({sample_id for sample_id, _ in taken}) == len(taken), "a sample trained twice"
    assert len({key for _, key in taken}) == len(taken), "a prompt trained twice in an epoch"
    last = records[4]
    # the rollouter ran ahead and was held back by the bound, saying so
    assert last["fully_async/count/pauses"] >= 1
    assert re.search(
        r"rollouter paused at weight version \d+: staleness_samples 4 >= "
        r"max_required_samples 4 \(= int\(required_samples 2 x \(1 \+ staleness_threshold 1\) "
        r"x trigger_parameter_sync_step 1\)\).*raise scheduler.staleness_threshold",
        result.stderr,
    )
    assert any(records[s]["fully_async/count/staleness_samples"] > 0 for s in (2, 3, 4))
    # stale samples are weighed against the engine's log-probs
    assert all("rollout_corr/rollout_is_mean" in records[s] for s in (1, 2, 3, 4))
    assert all(records[s]["timing_s/old_log_prob"] > 0 for s in (1, 2, 3, 4))


# ---------------------------------------------------------------------------- kill -9, resume


def test_a_run_killed_mid_way_resumes_with_its_counters_and_bound(tiny_task, tmp_path):
    steps = 4
    recipe = async_recipe(
        tiny_task,
        tmp_path,
        steps=steps,
        staleness_threshold=0.5,
        trigger_parameter_sync_step=2,
        max_version_lag="auto",
    )
    run_dir = tmp_path / "run"
    with background_run(recipe, tmp_path / "first.log") as process:
        wait_for_step(process, run_dir / "metrics.jsonl", step=2)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    killed_at = by_step(read_records(run_dir))
    assert max(killed_at) < steps, "the run finished before it was killed"

    rerun = check_ok(run_cli(recipe))
    resumed = re.search(r"resumed from \S+global_step_(\d+) \(step (\d+)\)", rerun.stderr)
    assert resumed, f"the rerun did not resume:\n{rerun.stderr[-2000:]}"
    resumed_step = int(resumed.group(1))
    records = check_steps(
        by_step(read_records(run_dir)), steps, sync_every=2, resumed_at=resumed_step, strict=True
    )
    before = killed_at[resumed_step]
    after = records[resumed_step + 1]
    # the counters go on from the checkpoint: the bound holds across the resume
    assert (
        after["fully_async/count/current_param_version"]
        >= (before["fully_async/count/current_param_version"])
    )
    assert after["fully_async/count/pauses"] >= before["fully_async/count/pauses"]
    assert after["perf/wall_clock_s"] > before["perf/wall_clock_s"]


def test_sigterm_stops_a_run_on_ray_as_ctrl_c_does(tiny_task, tmp_path):
    # the command's handler (SIGTERM interrupts the run) survives ray.init: the rollouter and
    # the actors are stopped and the run ends as interrupted, not through Ray's handler
    recipe = async_recipe(tiny_task, tmp_path, steps=30, trigger_parameter_sync_step=2)
    returncode, log, gone = sigterm_after_step(
        recipe, 2, "cluster.mode=ray", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"
    )
    assert returncode == 1, f"exit {returncode}:\n{log[-3000:]}"
    assert "Aborted!" in log
    assert "SIGTERM received" not in log  # the stack dump of Ray's failure-signal handler
    assert gone, "processes of the stopped run are still alive"
    run_dir = tmp_path / "run"
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")], "half-written folders"
    records = by_step(read_records(run_dir))
    assert {1, 2} <= set(records)
    assert all("fully_async/count/current_param_version" in records[s] for s in (1, 2))


# ---------------------------------------------------------------------------- a dead engine


@pytest.fixture
def ray_session():
    from tests.support import shared_ray_for_module

    with shared_ray_for_module() as ray:
        yield ray


KILL_RUN_STEPS = 4


def test_a_killed_engine_worker_on_ray_loses_and_repeats_nothing(
    tiny_task, tmp_path, monkeypatch, ray_session
):
    taken = []
    kills = []
    engine_pids = []
    take = Rollouter.take
    generate = Rollouter._generate

    def recording(self, count):
        if not engine_pids:
            engine_pids.extend(self.engines.engine_pids())
        samples, dropped = take(self, count)
        taken.extend((sample.sample_id, sample.key) for sample in samples)
        return samples, dropped

    async def killing(self, sample_id, key, number):
        # mid-run, with this sample's request on its way to the engine: the worker dies with
        # a request of the rollouter in flight, whatever the machine's load. The first 3
        # steps' worth of samples may start before the trainer's first step; this one starts
        # after it, and step 4 needs it
        if number == 3 * REQUIRED and not kills and engine_pids:

            async def kill_when_sent():
                await asyncio.sleep(0)
                kills.append(engine_pids[0])
                os.kill(engine_pids[0], signal.SIGKILL)

            asyncio.get_running_loop().create_task(kill_when_sent())
        return await generate(self, sample_id, key, number)

    monkeypatch.setattr(Rollouter, "take", recording)
    monkeypatch.setattr(Rollouter, "_generate", killing)
    recipe = async_recipe(tiny_task, tmp_path, steps=KILL_RUN_STEPS, staleness_threshold=1.0)
    result = CliRunner().invoke(
        cli,
        [
            "run",
            str(recipe),
            "cluster.mode=ray",
            "trainer.n_gpus_per_node=1",
            "rollout.n_gpus_per_node=1",
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert kills, "no engine worker was killed"
    assert "engine worker 0 died" in result.stderr
    assert "engine worker 0 is back (restart 1)" in result.stderr
    records = check_steps(by_step(read_records(tmp_path / "run")), KILL_RUN_STEPS)
    assert len(taken) == KILL_RUN_STEPS * REQUIRED
    assert len({sample_id for sample_id, _ in taken}) == len(taken), "a sample trained twice"
    assert len({key for _, key in taken}) == len(taken), "a prompt trained twice in an epoch"
    last = records[KILL_RUN_STEPS]
    trained = KILL_RUN_STEPS * REQUIRED
    # every sample generated was trained, dropped, or is still waiting: none lost
    assert last["fully_async/count/total_generated_samples"] >= (
        trained + last["fully_async/count/dropped_stale_samples"]
    )
