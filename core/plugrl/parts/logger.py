"""Metric loggers: where step metrics go (console, jsonl, tensorboard, wandb, ...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.recipe import Recipe


class MetricLogger(ABC):
    """Receives every step's metrics in the driver."""

    def __init__(self, recipe: Recipe, run_dir: Path) -> None:
        self.recipe = recipe
        self.run_dir = run_dir

    @abstractmethod
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (verl's names, scalar values) for ``step``."""

    def close(self) -> None:
        """Flush and close; called once at the end of a run, also a failed one."""
