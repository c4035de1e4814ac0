"""The run loop's contract with a scheduler (plugrl.run.loop): when steps run and stop, when
validation, logging and checkpoints happen and in which order, what a resumed run hands back,
and what is closed when a step fails.

The first tests drive :func:`run_loop` with recording stand-ins for the run's parts, so each
promise is checked alone and in milliseconds; the last ones run a scheduler through the whole
run (:func:`plugrl.testing.run_scheduler`, on the simulated parts) and resume it from a real
checkpoint.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import plugrl.run.loop as loop_module
from plugrl.parts.scheduler import Scheduler
from plugrl.run.loop import run_loop
from plugrl.testing import run_scheduler

# ------------------------------------------------------------------------------ stand-ins


class Events(list):
    """What happened, in order: ``(what, step)`` pairs."""

    def of(self, what: str) -> list[Any]:
        return [step for name, step in self if name == what]


class Hooks:
    def __init__(self, events: Events) -> None:
        self.events = events

    def on_run_start(self, recipe: Any, run_dir: Path) -> None:
        self.events.append(("run_start", None))


class Plugins:
    def __init__(self, events: Events) -> None:
        self.hook = Hooks(events)

    def registry(self, kind: str) -> Any:
        # the parts the loop builds itself (the health checks) come from the real registries
        from plugrl.plugin.manager import get_plugin_manager

        return get_plugin_manager().registry(kind)


class Actor:
    def export_hf(self, path: Path) -> None:
        raise AssertionError("these runs do not export")


class Parts:
    """The loop's side of RunParts: resume, weight sync, checkpoints, close."""

    def __init__(self, events: Events, resumed: dict[str, Any] | None, has_val: bool) -> None:
        self.events = events
        self.resumed = resumed
        self.val_data = object() if has_val else None
        self.actor = Actor()
        self.saved: dict[int, dict[str, Any]] = {}

    def resume(self) -> dict[str, Any] | None:
        return self.resumed

    def sync_weights(self) -> dict[str, Any]:
        self.events.append(("sync_weights", None))
        return {}

    def save_checkpoint(self, step: int, state: dict[str, Any]) -> Path:
        self.events.append(("checkpoint", step))
        self.saved[step] = copy.deepcopy(state)  # written now, as a real checkpoint is
        return Path(f"global_step_{step}")

    def close(self) -> None:
        self.events.append(("parts_close", None))


class Context:
    """The loop's side of RunContext: the recipe, the parts, the step observers."""

    def __init__(self, recipe: Any, parts: Parts, events: Events, tmp_path: Path) -> None:
        self.recipe = recipe
        self.parts = parts
        self.events = events
        self.run_dir = tmp_path
        self.plugins = Plugins(events)
        self.logged: dict[int, dict[str, Any]] = {}

    def build_parts(self, engine_needs: Any = None) -> Parts:
        self.events.append(("build_parts", None))
        return self.parts

    def step_end(self, step: int, metrics: Any) -> None:
        self.events.append(("log", step))
        self.logged[step] = dict(metrics)


class Steps(Scheduler):
    """Counts its steps; returns ``None`` from step ``stop_at`` on, raises at ``fail_at``."""

    def __init__(
        self, events: Events, total: int, stop_at=None, fail_at=None, clip_ratio=0.0
    ) -> None:
        self.events, self.total, self.stop_at, self.fail_at = events, total, stop_at, fail_at
        self.clip_ratio = clip_ratio
        self.started: tuple[int, Any] | None = None
        self.calls = 0

    def total_steps(self, parts: Any) -> int:
        return self.total

    def start(self, parts: Any, step: int, saved: Any) -> None:
        self.started = (step, saved)
        self.calls = (saved or {}).get("calls", 0)
        self.events.append(("start", step))

    def train_step(self, parts: Any, step: int) -> dict[str, Any] | None:
        self.events.append(("train_step", step))
        if self.fail_at == step:
            raise RuntimeError(f"step {step} broke")
        if self.stop_at is not None and step >= self.stop_at:
            return None
        self.calls += 1
        return {
            "critic/score/mean": step / 10,
            "training/global_step": step,
            "response_length/clip_ratio": self.clip_ratio,
        }

    def checkpoint_state(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def close(self) -> None:
        self.events.append(("scheduler_close", None))


@pytest.fixture
def loop(plugrl_recipe, tmp_path, monkeypatch):
    """loop(scheduler_options, trainer=..., resumed=None, has_val=True) -> (events, context,
    scheduler, returned metrics or the exception raised)."""

    def run(*, trainer=None, resumed=None, has_val=True, **scheduler_options):
        events = Events()

        def validate(parts, recipe, step):
            events.append(("validate", step))
            return {"val-core/sim/acc/mean@1": step / 100}

        monkeypatch.setattr(loop_module, "validate", validate)
        settings = {"val_before_train": False, "test_freq": -1, "save_freq": -1}
        recipe = plugrl_recipe({"trainer": {**settings, **(trainer or {})}})
        parts = Parts(events, resumed, has_val)
        context = Context(recipe, parts, events, tmp_path)
        scheduler = Steps(events, **scheduler_options)
        try:
            outcome = run_loop(context, scheduler)
        except Exception as exc:
            outcome = exc
        return events, context, scheduler, outcome

    return run


# ------------------------------------------------------------------------------ the contract


def test_the_health_checks_write_into_the_step_they_fire_on_before_it_is_logged(loop):
    _, context, _, last = loop(total=4, clip_ratio=1.0)
    assert [step for step, m in context.logged.items() if "health/response_clipping" in m] == [2]
    assert last == context.logged[4] and "health/response_clipping" not in last


def test_a_health_check_in_error_mode_stops_after_the_log_before_the_checkpoint(loop):
    from plugrl.errors import HealthError

    events, context, _, outcome = loop(
        total=4,
        clip_ratio=1.0,
        trainer={"save_freq": 1, "health": {"mode": "error", "checks": ["response_clipping"]}},
    )
    assert isinstance(outcome, HealthError)
    assert str(outcome).startswith("health check 'response_clipping': ")
    assert sorted(context.logged) == [1, 2] and events.of("checkpoint") == [1]
    assert context.logged[2]["health/response_clipping"] == 1.0


def test_a_step_that_returns_none_ends_the_run_at_the_step_before(loop):
    events, context, _, last = loop(total=5, stop_at=3, trainer={"save_freq": 1})
    assert events.of("train_step") == [1, 2, 3]  # no step is asked for after the None
    assert sorted(context.logged) == [1, 2]
    assert events.of("checkpoint") == [1, 2]
    assert last == context.logged[2]
    assert events[-2:] == [("scheduler_close", None), ("parts_close", None)]


def test_a_run_whose_first_step_returns_none_trains_nothing_and_ends_cleanly(loop):
    events, context, _, last = loop(total=3, stop_at=1, trainer={"save_freq": 1})
    assert (events.of("train_step"), context.logged, last) == ([1], {}, {})
    assert events.of("checkpoint") == []
    assert ("parts_close", None) in events


def test_validation_runs_before_training_at_test_freq_and_at_the_last_step(loop):
    events, context, _, _ = loop(total=5, trainer={"test_freq": 2, "val_before_train": True})
    assert events.of("validate") == [0, 2, 4, 5]
    assert context.logged[0]["val-core/sim/acc/mean@1"] == 0.0
    assert "perf/wall_clock_s" in context.logged[0]
    assert context.logged[4]["val-core/sim/acc/mean@1"] == 0.04  # the step's log holds it
    assert "val-core/sim/acc/mean@1" not in context.logged[3]


def test_without_validation_data_nothing_is_validated(loop):
    events, _, _, _ = loop(total=3, has_val=False, trainer={"test_freq": 1})
    assert events.of("validate") == []


def test_a_step_is_validated_then_logged_then_checkpointed(loop):
    events, _, _, _ = loop(total=4, trainer={"test_freq": 2, "save_freq": 2})
    per_step = [(what, step) for what, step in events if step in (2, 4)]
    # a run killed between the log and the checkpoint logs the step again when it resumes
    assert per_step == [
        ("train_step", 2),
        ("validate", 2),
        ("log", 2),
        ("checkpoint", 2),
        ("train_step", 4),
        ("validate", 4),
        ("log", 4),
        ("checkpoint", 4),
    ]


def test_checkpoints_come_at_save_freq_and_the_last_step_with_the_loops_state(loop):
    events, context, _, _ = loop(
        total=5, trainer={"save_freq": 2, "test_freq": 2, "val_before_train": True}
    )
    assert events.of("checkpoint") == [2, 4, 5]
    saved = context.parts.saved[4]
    assert saved["scheduler"] == {"calls": 4}
    assert [entry["val-core/sim/acc/mean@1"] for entry in saved["validation"]] == [0, 0.02, 0.04]
    assert 0 <= saved["wall_clock_s"] <= context.parts.saved[5]["wall_clock_s"]


def test_a_resumed_run_hands_back_the_step_the_scheduler_state_and_the_clock(loop):
    resumed = {
        "step": 3,
        "wall_clock_s": 1000.0,
        "validation": [{"val-core/sim/acc/mean@1": 0.0}],
        "scheduler": {"calls": 3},
    }
    events, context, scheduler, _ = loop(total=5, resumed=resumed, trainer={"save_freq": 1})
    assert scheduler.started == (3, {"calls": 3})
    assert events.of("train_step") == [4, 5]
    assert events.index(("start", 3)) < events.index(("sync_weights", None))
    assert context.logged[4]["perf/wall_clock_s"] >= 1000.0  # the clock goes on from there
    assert context.parts.saved[5]["scheduler"] == {"calls": 5}
    assert len(context.parts.saved[5]["validation"]) == 2  # the history goes on too


def test_a_resumed_run_that_already_finished_trains_nothing(loop):
    resumed = {"step": 3, "scheduler": {"calls": 3}}
    events, context, _, last = loop(total=3, resumed=resumed)
    assert (events.of("train_step"), context.logged, last) == ([], {}, {})


def test_a_step_that_fails_closes_the_scheduler_then_the_parts_and_raises(loop):
    events, context, _, outcome = loop(total=4, fail_at=2, trainer={"save_freq": 1})
    assert isinstance(outcome, RuntimeError) and str(outcome) == "step 2 broke"
    assert sorted(context.logged) == [1] and events.of("checkpoint") == [1]
    assert events[-2:] == [("scheduler_close", None), ("parts_close", None)]


def test_the_parts_are_closed_when_the_scheduler_fails_to_close(loop, monkeypatch):
    def broken_close(self):
        raise RuntimeError("close broke")

    monkeypatch.setattr(Steps, "close", broken_close)
    events, _, _, outcome = loop(total=2)
    assert str(outcome) == "close broke"
    assert events[-1] == ("parts_close", None)


# ------------------------------------------------------------------------------ whole runs


class CountingScheduler(Scheduler):
    """The sync scheduler's step, plus a counter kept in its checkpoint state; ``None`` from
    step ``scheduler.stop_at`` on (0: never)."""

    def __init__(self, config, context):
        super().__init__(config, context)
        from plugrl_sync.scheduler import SyncScheduler

        self.inner = SyncScheduler(config, context)
        self.calls = 0
        self.started_with: tuple[int, Any] | None = None

    def start(self, parts, step, saved):
        self.started_with = (step, saved)
        self.calls = (saved or {}).get("calls", 0)
        STARTS.append(self.started_with)

    def train_step(self, parts, step):
        if 0 < STOP_AT[0] <= step:
            return None
        self.calls += 1
        return self.inner.train_step(parts, step) | {"counting/calls": self.calls}

    def checkpoint_state(self):
        return {"calls": self.calls}


STARTS: list[tuple[int, Any]] = []
STOP_AT = [0]


@pytest.fixture
def counting(plugrl_plugin_manager):
    STARTS.clear()
    STOP_AT[0] = 0
    yield
    STOP_AT[0] = 0


def test_a_run_resumed_from_its_checkpoint_goes_on_as_the_uninterrupted_one(tmp_path, counting):
    whole = run_scheduler(CountingScheduler, tmp_path, steps=4, overrides={"trainer.save_freq": 2})
    assert whole.checkpoints == [2, 4]
    # the same run again from its checkpoint of step 2, as if it had stopped after step 3
    resumed = run_scheduler(
        CountingScheduler,
        tmp_path,
        steps=4,
        overrides={
            "trainer.save_freq": 2,
            "trainer.resume_mode": str(whole.run_dir / "global_step_2"),
        },
    )
    assert STARTS[-1] == (2, {"calls": 2})
    assert [step for step, _ in resumed.logged] == [3, 4]
    for step in (3, 4):
        again, original = resumed.metrics[step], whole.metrics[step]
        assert again["counting/calls"] == original["counting/calls"] == step
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss"):
            assert again[key] == original[key], (step, key)
    versions = [c["to"] for c in resumed.engine_calls if c["event"] == "begin_weight_update"]
    assert versions == [2, 3, 4]  # the weight version came back with the checkpoint


def test_run_scheduler_reports_steps_metrics_checkpoints_and_engine_calls(tmp_path, counting):
    STOP_AT[0] = 3
    run = run_scheduler(
        CountingScheduler,
        tmp_path,
        steps=5,
        overrides={"trainer.save_freq": 1, "trainer.test_freq": 2},
    )
    assert run.steps_run == 2 and sorted(run.metrics) == [1, 2]
    assert run.checkpoints == [1, 2]
    assert "val-core/plugrl/sim/acc/mean@1" in run.metrics[2]
    assert run.last_metrics == run.metrics[2]
    events = [call["event"] for call in run.engine_calls]
    assert events[0] == "start" and events.count("generate") >= 2 * 4
    assert run.recipe.scheduler.name == "under_test_countingscheduler"
