"""Metric loggers: where step metrics go (console, jsonl, tensorboard, wandb, ...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.parts.context import PartContext
    from plugrl.recipe import TrainerConfig


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
