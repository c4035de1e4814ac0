"""Metric loggers: where step metrics go (console, jsonl, tensorboard, wandb, ...).

Beside the interface, what experiment-tracker loggers share: scalar metrics, the recipe as
parameters, and the id that lets a resumed run continue the tracker's run of its folder.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugrl.parts.context import PartContext
    from plugrl.recipe import Recipe, TrainerConfig


class MetricLogger(ABC):
    """Receives every step's metrics in the driver.

    Built as ``Logger(config, context)``: ``config`` is the ``trainer`` section
    (``project_name``, ``experiment_name``), ``context.run_dir`` the run folder.
    """

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        if context.run_dir is None:
            raise ValueError("a metric logger is built with context.run_dir")
        self.config = config
        self.context = context
        self.recipe = context.recipe
        self.run_dir: Path = context.run_dir

    @abstractmethod
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (verl's names, scalar values) for ``step``."""

    def close(self, status: str = "completed", error: str | None = None) -> None:
        """Flush and close; called once at the end of a run, also a failed one. ``status`` is
        ``"completed"``, ``"failed"`` or ``"interrupted"`` (as ``on_run_end`` says it);
        ``error`` is one line naming what ended a failed run."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    """The numeric metrics as Python numbers (torch and numpy scalars unwrapped, booleans as
    0/1); anything else (a string, a list) is left out. NaN and infinities are kept: every
    tracker here takes them."""
    found: dict[str, int | float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            try:
                value = value.item()
            except (TypeError, ValueError):  # an array of several values
                continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)):
            found[str(key)] = value
    return found


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value as text)`` for every leaf of the recipe (``actor.optim.lr``);
    lists and empty mappings are written as JSON."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, dotted + ".")
        elif isinstance(value, (Mapping, list, tuple)):
            yield dotted, json.dumps(value, default=str)
        else:
            yield dotted, "null" if value is None else str(value)


def continues_earlier_run(recipe: Recipe, run_dir: Path) -> bool:
    """Whether this run resumes from a checkpoint, and so should continue the tracker's run of
    the same folder rather than start a new one (a run that starts over, with
    ``trainer.resume_mode=disable`` or no checkpoint yet, gets a new tracker run)."""
    mode = recipe.trainer.resume_mode
    if mode == "disable":
        return False
    if mode == "auto":
        from plugrl.state.checkpoint import LATEST_FILE

        return (run_dir / LATEST_FILE).exists()
    return True  # a checkpoint path


class RunIdFile:
    """A tracker's run id kept in the run folder (``wandb_run_id.txt``, ...)."""

    def __init__(self, run_dir: Path, tracker: str) -> None:
        self.path = Path(run_dir) / f"{tracker}_run_id.txt"

    def read(self) -> str | None:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def write(self, run_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"{run_id}\n", encoding="utf-8")
