"""Composing a run: resolve the recipe's parts, hand them to the scheduler, observe it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.cluster.services import RunServices
from plugrl.errors import RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.device import resolve_device_name
from plugrl.parts.logger import MetricLogger
from plugrl.parts.scheduler import Scheduler
from plugrl.plan.planner import check_memory_at_launch
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import Recipe, resolve_paths
from plugrl.run.folder import (
    check_model_folders,
    check_resume,
    missing_folders,
    prepare_run_dir,
    record_recipe,
    remove_empty_folders,
)
from plugrl.run.loop import run_loop

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts

logger = logging.getLogger("plugrl.run")


@attrs.define
class RunContext:
    """The run around a scheduler: the recipe, the run folder, the plugins, and the
    observers (loggers and ``on_step_end`` hooks).

    :meth:`build_parts` composes the run the recipe describes (data, reward, algorithm pieces,
    trainer worker groups, engine group, weight transport; :mod:`plugrl.compose`); the run
    loop (:func:`plugrl.run.loop.run_loop`) calls it once.
    """

    recipe: Recipe
    run_dir: Path
    plugins: PluginManager
    device_name: str
    loggers: list[MetricLogger] = attrs.field(factory=list)
    last_metrics: dict[str, Any] = attrs.field(factory=dict)
    recipe_recorded: bool = False

    def part(self, kind: str, name: str) -> Any:
        """The class or function registered as ``name`` of ``kind`` (imported now)."""
        return self.plugins.registry(kind).load(name)

    def part_context(self, **fields: Any) -> PartContext:
        """A :class:`PartContext` of this run (recipe, plugins, run folder) plus ``fields``."""
        fields.setdefault("services", RunServices())
        return PartContext(recipe=self.recipe, plugins=self.plugins, run_dir=self.run_dir, **fields)

    def build_parts(self, engine_needs: Mapping[str, str] | None = None) -> RunParts:
        """Everything the recipe chose, built and checked (see
        :func:`plugrl.compose.run_parts.build_run_parts`); ``engine_needs`` are the engine
        capabilities the scheduler needs, with the reasons. Close the result at the end of the
        run."""
        from plugrl.compose.run_parts import build_run_parts

        parts = build_run_parts(self, dict(engine_needs or {}))
        self.record_recipe()
        return parts

    def record_recipe(self) -> None:
        """Write the recipe this segment of the run uses into the run folder, once the run
        got past its start-up checks (see :func:`record_recipe`)."""
        if not self.recipe_recorded:
            record_recipe(self.recipe, self.run_dir, self.plugins)
            self.recipe_recorded = True

    def step_end(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report a finished step to every logger and ``on_step_end`` observer."""
        self.last_metrics = dict(metrics)
        for metric_logger in self.loggers:
            metric_logger.log(metrics, step)
        self.plugins.hook.on_step_end(step=step, metrics=dict(metrics))


def build_loggers(recipe: Recipe, run_dir: Path, plugins: PluginManager) -> list[MetricLogger]:
    from plugrl.plugin.build import build_part

    context = PartContext(recipe=recipe, plugins=plugins, run_dir=run_dir)
    return [build_part("loggers", name, recipe.trainer, context) for name in recipe.trainer.logger]


def apply_device_env(device_cls: Any, recipe: Recipe) -> None:
    """For a run in one process, the environment the device wants for its trainer and engine
    (:meth:`Device.worker_env <plugrl.parts.device.Device.worker_env>`), unless set already."""
    if recipe.cluster.mode == "ray":
        return  # the workers get it through Ray
    for kind in ("trainer", "rollout"):
        for key, value in device_cls.worker_env(kind).items():
            if key not in os.environ:
                os.environ[key] = value
                logger.info("%s=%s (for the %s device)", key, value, device_cls.name)


def run_recipe(recipe: Recipe, plugins: PluginManager) -> dict[str, Any]:
    """Run a validated recipe to the end with the parts ``plugins`` registers; returns the last
    step's metrics. Its relative paths are taken from the working folder
    (:func:`~plugrl.recipe.resolve_paths`, which :func:`~plugrl.recipe.build_recipe` applied
    already), before anything reaches a worker."""
    recipe = resolve_paths(recipe, plugins)
    device_name = resolve_device_name(recipe, plugins)
    device_entry = plugins.registry("devices").get(device_name)
    device_entry.check_available()
    if not device_entry.load().is_available():
        raise RecipeError(
            f"device {device_name!r} is not available on this machine "
            "(no hardware or driver); use device.name=cpu or auto",
            key="device.name",
        )
    check_model_folders(recipe)
    # before any model loads: a recipe that cannot fit fails in a second, not after loading
    check_memory_at_launch(recipe, plugins, device_entry.load(), device_name)
    apply_device_env(device_entry.load(), recipe)
    new_folders = missing_folders(Path(os.path.abspath(recipe.run_dir)))
    run_dir = prepare_run_dir(recipe)
    try:
        check_resume(recipe, run_dir, plugins)
        return _run_in(RunContext(recipe, run_dir, plugins, device_name))
    except BaseException:
        # a run that failed before it wrote anything (at start-up, mostly) leaves behind no
        # folder that it made; a folder that existed before, or holds anything, stays
        remove_empty_folders(new_folders)
        raise


def _run_in(context: RunContext) -> dict[str, Any]:
    """The run loop in the run folder that ``context`` names, with the loggers and the
    ``on_run_end`` hook told how it ended."""
    recipe, run_dir, plugins = context.recipe, context.run_dir, context.plugins
    status, error = "failed", None
    try:
        from plugrl.plugin.build import build_part

        context.loggers = build_loggers(recipe, run_dir, plugins)
        scheduler: Scheduler = build_part(
            "schedulers", recipe.scheduler.name, recipe.scheduler, context
        )
        metrics = run_loop(context, scheduler)
        status = "completed"
        return metrics
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException as exc:
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        raise
    finally:
        try:
            plugins.hook.on_run_end(status=status, metrics=dict(context.last_metrics))
        finally:
            for metric_logger in context.loggers:
                try:
                    metric_logger.close(status, error)
                except Exception as exc:  # a logger failing to flush must not hide the cause
                    logger.warning(
                        "logger %s failed to close: %s", type(metric_logger).__name__, exc
                    )
