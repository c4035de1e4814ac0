"""Runs of a scheduler on the simulated parts (the ``plugrl_sim`` plugin, installed with
plugrl): the task and recipe they run on, and :func:`run_scheduler`, which runs a scheduler
for a few steps through the core's own run loop and returns what a test asserts on.

The parts are chosen by their registered names (``sim``), so nothing here imports the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

import plugrl

if TYPE_CHECKING:
    from plugrl.parts.scheduler import Scheduler, SchedulerConfig
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

SIM_PARTS = "sim"
"""The name the simulated engine and backend are registered under."""
SIM_DATA_SOURCE = "plugrl/sim"
"""The data source of the simulated prompts, scored by the reward function of that name."""


@attrs.frozen
class SimTask:
    """A tokenizer folder and prompt files for simulated runs."""

    root: Path
    tokenizer: Path
    train_file: Path
    val_file: Path


def build_sim_task(root: str | Path, *, num_train: int = 256, num_val: int = 16) -> SimTask:
    """Write a tokenizer (a tiny one of :mod:`plugrl.testing.tiny`, trained here) and
    ``num_train`` / ``num_val`` prompts of data source ``plugrl/sim`` under ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from plugrl.testing.tiny import make_tiny_tokenizer

    root = Path(root)
    task = SimTask(root, root / "tokenizer", root / "train.parquet", root / "val.parquet")
    root.mkdir(parents=True, exist_ok=True)
    if not (task.tokenizer / "tokenizer_config.json").exists():
        make_tiny_tokenizer(vocab_size=300).save_pretrained(task.tokenizer)
    for path, count, split in (
        (task.train_file, num_train, "train"),
        (task.val_file, num_val, "val"),
    ):
        rows = [
            {
                "data_source": SIM_DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"Write {index} words."}],
                "ability": "sim",
                "reward_model": {"style": "rule", "ground_truth": str(index % 2)},
                "extra_info": {"split": split, "index": index},
            }
            for index in range(count)
        ]
        pq.write_table(pa.Table.from_pylist(rows), path)
    return task


def sim_recipe(
    task: SimTask,
    run_dir: str | Path,
    *,
    scheduler: str = "sync",
    rollout_devices: int = 2,
    train_devices: int = 2,
    colocate: bool = True,
    max_response_length: int = 256,
    train_batch_size: int = 16,
    n: int = 4,
    steps: int = 4,
) -> dict[str, Any]:
    """A recipe of the simulated parts on ``task``: a GRPO run whose engine has
    ``rollout_devices`` simulated devices and trainer ``train_devices``, one process."""
    return {
        "model": {"tokenizer_path": str(task.tokenizer)},
        "data": {
            "train_files": [str(task.train_file)],
            "val_files": [str(task.val_file)],
            "train_batch_size": train_batch_size,
            "max_prompt_length": 32,
            "max_response_length": max_response_length,
        },
        "device": "cpu",
        "actor": {
            "backend": SIM_PARTS,
            "sim_devices": train_devices,
            "ppo_mini_batch_size": train_batch_size,
            "optim": {"lr": 0.01},
        },
        "rollout": {
            "engine": SIM_PARTS,
            "sim_devices": rollout_devices,
            "colocate": colocate,
            "n": n,
            "max_num_seqs": 64,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "scheduler": {"name": scheduler},
        "trainer": {
            "total_training_steps": steps,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "val_before_train": False,
            "test_freq": -1,
            "save_freq": -1,
            "seed": 1,
        },
    }


@attrs.frozen
class SchedulerRun:
    """What :func:`run_scheduler` saw of a run."""

    metrics: dict[int, dict[str, Any]]
    """The metrics logged for each step, by step (0: validation before training); a step
    logged twice (a resumed run does the steps after its checkpoint again) keeps its last."""
    logged: list[tuple[int, dict[str, Any]]]
    """Every ``(step, metrics)`` in the order the run logged them."""
    last_metrics: dict[str, Any]
    """The last step's metrics, as :func:`plugrl.run.runner.run_recipe` returned them."""
    checkpoints: list[int]
    """The steps whose checkpoint is in the run folder when the run ends."""
    engine_calls: list[dict[str, Any]]
    """The simulated engines' phase-changing calls in order, one dict each (``event``:
    ``start``, ``generate``, ``sleep``, ``wake_up``, ``begin_weight_update``,
    ``finish_weight_update``; ``version``: the engine's weight version then; ...)."""
    run_dir: Path
    recipe: Recipe

    @property
    def steps_run(self) -> int:
        """The last training step the run logged (0: none)."""
        return max((step for step, _ in self.logged), default=0)


class _StepRecorder:
    """A plugin object that keeps every step the run reports."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []

    @plugrl.hookimpl
    def on_step_end(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.logged.append((step, dict(metrics)))


class _SchedulerUnderTest:
    """A plugin object that registers one scheduler class under a name."""

    def __init__(
        self, name: str, scheduler: type[Scheduler], config: type[SchedulerConfig] | None
    ) -> None:
        self.name, self.scheduler, self.config = name, scheduler, config

    @plugrl.hookimpl
    def register_schedulers(self, register: Any) -> None:
        register(self.name, self.scheduler, config=self.config, description="under test")


def run_scheduler(
    scheduler: str | type[Scheduler],
    folder: str | Path,
    *,
    steps: int = 3,
    overrides: Mapping[str, Any] | None = None,
    config: type[SchedulerConfig] | None = None,
    plugins: PluginManager | None = None,
) -> SchedulerRun:
    """Run ``scheduler`` (a registered name, or a :class:`~plugrl.parts.scheduler.Scheduler`
    subclass with its ``config`` class, registered for the run's duration) for ``steps``
    steps on the simulated parts, through the core's run loop as ``plugrl run`` runs it.

    ``folder`` gets the task (``task/``, built once and reused) and the run folder (``run/``);
    call again with the same folder and ``{"trainer.resume_mode": "auto"}`` to resume. The
    recipe is :func:`sim_recipe`'s with 4 prompts of 2 responses a step, responses of 32
    tokens at most, one simulated device each side, a trace of the engines' calls, then
    ``overrides`` (``{"trainer.save_freq": 1, "scheduler.my_option": 2}``; top-level keys may
    be dotted). ``plugins`` defaults to the process's plugin manager (in a test with the
    ``plugrl_plugin_manager`` fixture, that one). A failing run raises what it raised."""
    from plugrl.parts.scheduler import Scheduler, SchedulerConfig
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.run.runner import run_recipe
    from plugrl.state.checkpoint import CheckpointManager
    from plugrl.testing import make_recipe

    if steps < 1:
        raise ValueError(f"run_scheduler needs at least 1 step, got {steps}")
    plugins = plugins if plugins is not None else get_plugin_manager()
    registered: list[str] = []
    if isinstance(scheduler, str):
        name = scheduler
    elif isinstance(scheduler, type) and issubclass(scheduler, Scheduler):
        name = f"under_test_{scheduler.__name__.lower()}"
        under_test = _SchedulerUnderTest(name, scheduler, config or SchedulerConfig)
        registered.append(plugins.register(under_test, f"plugrl-testing-{name}") or "")
    else:
        raise TypeError(
            f"run_scheduler takes a registered scheduler's name or a Scheduler subclass, got "
            f"{scheduler!r}; pass the class, not an instance (the run builds it)"
        )
    folder = Path(folder)
    task = SimTask(
        folder / "task",
        folder / "task" / "tokenizer",
        folder / "task" / "train.parquet",
        folder / "task" / "val.parquet",
    )
    if not task.train_file.exists():
        task = build_sim_task(task.root, num_train=64, num_val=4)
    run_dir = folder / "run"
    trace = folder / "engine_calls.jsonl"
    base = sim_recipe(
        task,
        run_dir,
        scheduler=name,
        rollout_devices=1,
        train_devices=1,
        max_response_length=32,
        train_batch_size=4,
        n=2,
        steps=steps,
    )
    base["rollout"]["sim_trace_file"] = str(trace)
    recorder = _StepRecorder()
    registered.append(plugins.register(recorder, f"plugrl-testing-steps-{id(recorder)}") or "")
    try:
        recipe = make_recipe(overrides, base=base, plugins=plugins)
        trace.unlink(missing_ok=True)
        last = run_recipe(recipe, plugins)
    finally:
        for plugin_name in registered:
            if plugin_name and plugins.pm.has_plugin(plugin_name):
                plugins.unregister(plugin_name)
    calls = []
    if trace.exists():
        calls = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    by_step: dict[int, dict[str, Any]] = {}
    for step, metrics in recorder.logged:
        by_step[step] = metrics
    return SchedulerRun(
        metrics=by_step,
        logged=recorder.logged,
        last_metrics=last,
        checkpoints=CheckpointManager(recipe.run_dir).steps(),
        engine_calls=calls,
        run_dir=recipe.run_dir,
        recipe=recipe,
    )
