"""Composing a run: resolve the recipe's parts, hand them to the scheduler, observe it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.errors import PluginError, RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.logger import MetricLogger
from plugrl.parts.scheduler import Scheduler
from plugrl.plugins import PluginManager, get_plugin_manager
from plugrl.recipe import Recipe

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts

logger = logging.getLogger("plugrl.run")


def resolve_device_name(recipe: Recipe, plugins: PluginManager) -> str:
    """The device a run uses: ``device.name``, or for ``auto`` the first one a plugin detects."""
    name = recipe.device.name
    if name != "auto":
        return name
    detected = plugins.hook.detect_device()
    if detected is None:
        raise PluginError(
            "device.name is 'auto' but no plugin detected a device (is the cpu "
            "plugin disabled?); set device.name"
        )
    return detected


@attrs.define
class RunContext:
    """What a scheduler gets: the recipe, the run folder, the plugins, and the observers.

    :meth:`build_parts` composes the run the recipe describes (data, reward, algorithm pieces,
    trainer worker groups, engine group, weight transport; :mod:`plugrl.compose`); a scheduler
    that places parts its own way builds them with :func:`plugrl.compose.build.build_part`.
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
            record_recipe(self.recipe, self.run_dir)
            self.recipe_recorded = True

    def step_end(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report a finished step to every logger and ``on_step_end`` observer."""
        self.last_metrics = dict(metrics)
        for metric_logger in self.loggers:
            metric_logger.log(metrics, step)
        self.plugins.hook.on_step_end(step=step, metrics=dict(metrics))


def build_loggers(recipe: Recipe, run_dir: Path, plugins: PluginManager) -> list[MetricLogger]:
    from plugrl.compose.build import build_part

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


# Keys whose change between two segments of one run makes the resumed run another experiment.
WATCHED_ON_RESUME = ("data.train_batch_size", "rollout.n", "actor.optim.lr")
RECIPE_FILE = "recipe.yaml"


def _recipe_files(run_dir: Path) -> list[Path]:
    """``recipe.yaml``, then ``recipe.2.yaml``, ``recipe.3.yaml``...: one per segment."""
    files = [run_dir / RECIPE_FILE] if (run_dir / RECIPE_FILE).exists() else []
    numbered = []
    for path in run_dir.glob("recipe.*.yaml"):
        middle = path.name[len("recipe.") : -len(".yaml")]
        if middle.isdigit():
            numbered.append((int(middle), path))
    return files + [path for _, path in sorted(numbered)]


def _dotted(data: Mapping[str, Any], key: str) -> Any:
    value: Any = data
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def record_recipe(recipe: Recipe, run_dir: Path) -> Path:
    """Keep the recipe of each segment of a run: the first as ``recipe.yaml``, a resumed run
    whose recipe differs from the last one's as ``recipe.N.yaml`` (nothing is overwritten).
    Warns when a resume changes a key that makes it another experiment
    (:data:`WATCHED_ON_RESUME`)."""
    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    text = recipe.to_yaml()
    files = _recipe_files(run_dir)
    if files:
        last_text = files[-1].read_text(encoding="utf-8")
        if last_text == text:
            return files[-1]
        last = yaml.safe_load(last_text) or {}
        now = recipe.to_dict()
        for key in WATCHED_ON_RESUME:
            before, after = _dotted(last, key), _dotted(now, key)
            if before != after:
                logger.warning(
                    "this run continues %s, which used %s=%s; it now uses %s, so the steps "
                    "before and after are not one experiment",
                    run_dir,
                    key,
                    before,
                    after,
                )
        path = run_dir / f"recipe.{len(files) + 1}.yaml"
    else:
        path = run_dir / RECIPE_FILE
    path.write_text(text, encoding="utf-8")
    return path


def prepare_run_dir(recipe: Recipe) -> Path:
    """The run folder, created and checked writable, with a one-line error otherwise."""
    run_dir = recipe.run_dir
    key = "trainer.default_local_dir"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecipeError(
            f"cannot create the run folder {run_dir} ({exc.strerror}); choose a folder you can "
            "write to",
            key=key,
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RecipeError(
            f"the run folder {run_dir} is not writable; choose a folder you can write to", key=key
        )
    return run_dir


MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_folders(recipe: Recipe) -> None:
    """``model.path`` holds a Hugging Face model and the tokenizer folder a tokenizer: checked
    before anything is written or started, with the key and the fix in one line."""
    model = recipe.model
    if model.path is None:
        return
    for key, path, needed, what in (
        ("model.path", model.path, MODEL_FILES, "Hugging Face model"),
        (
            "model.tokenizer_path" if model.tokenizer_path else "model.path",
            model.tokenizer_path or model.path,
            TOKENIZER_FILES,
            "tokenizer",
        ),
    ):
        folder = Path(path)
        if not folder.is_dir():
            raise RecipeError(
                f"{folder} is not a folder; set a local Hugging Face model folder", key=key
            )
        if not any((folder / name).is_file() for name in needed):
            raise RecipeError(
                f"{folder} holds no {what} (none of {', '.join(needed)}); point it at a folder "
                "that save_pretrained wrote",
                key=key,
            )


def run_recipe(recipe: Recipe, plugins: PluginManager | None = None) -> dict[str, Any]:
    """Run a validated recipe to the end; returns the last step's metrics."""
    plugins = plugins or get_plugin_manager()
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
    apply_device_env(device_entry.load(), recipe)
    run_dir = prepare_run_dir(recipe)
    context = RunContext(recipe, run_dir, plugins, device_name)
    status, error = "failed", None
    try:
        from plugrl.compose.build import build_part

        context.loggers = build_loggers(recipe, run_dir, plugins)
        scheduler: Scheduler = build_part(
            "schedulers", recipe.scheduler.name, recipe.scheduler, context
        )
        plugins.hook.on_run_start(recipe=recipe, run_dir=run_dir)
        metrics = scheduler.run()
        context.record_recipe()  # a scheduler that built its parts its own way
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
