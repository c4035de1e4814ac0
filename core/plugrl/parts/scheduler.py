"""Schedulers: the loop that drives a run (generate, score, estimate, update, sync weights)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.config import option

if TYPE_CHECKING:
    from plugrl.run import RunContext


@attrs.define(kw_only=True)
class SchedulerConfig:
    """The ``scheduler`` section. ``scheduler: fully_async`` is short for
    ``scheduler: {name: fully_async}``; the chosen scheduler's config class extends this one."""

    name: str = option(
        "sync",
        "Scheduler: sync (generate then train) or fully_async "
        "(rollout and training overlap, bounded staleness).",
        registry="schedulers",
    )


class Scheduler(ABC):
    """Owns the training loop. Built in the driver with everything the recipe chose."""

    provides: ClassVar[frozenset[str] | None] = None
    """Optional batch columns this scheduler produces when an advantage estimator ``requires``
    them (``reward_baselines`` for ReMax, ``values`` with a critic), checked at start-up;
    ``None`` leaves them unchecked."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.recipe = context.recipe
        self.config: SchedulerConfig = context.recipe.scheduler

    @abstractmethod
    def run(self) -> dict[str, Any]:
        """Train until ``trainer.total_training_steps`` (or epochs) are done; return the last
        step's metrics. Call ``context.step_end(step, metrics)`` after every step."""
