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
    """Owns the training loop. Built in the driver as ``Scheduler(config, context)``: ``config``
    is the ``scheduler`` section read into the scheduler's config class, ``context`` the
    :class:`~plugrl.run.RunContext`, whose :meth:`~plugrl.run.RunContext.build_parts` composes
    everything else the recipe chose (:mod:`plugrl.compose`)."""

    provides: ClassVar[frozenset[str] | None] = None
    """Optional batch columns this scheduler produces when an advantage estimator ``requires``
    them (``reward_baselines`` for ReMax, ``values`` with a critic), checked at start-up;
    ``None`` leaves them unchecked."""

    engine_needs: ClassVar[dict[str, str]] = {}
    """Engine capabilities (:class:`~plugrl.parts.rollout.Capability` values) this scheduler
    needs, each with the reason shown when the chosen engine lacks it; checked at start-up.
    Override :meth:`needed_capabilities` when they depend on the recipe."""

    def __init__(self, config: SchedulerConfig, context: RunContext) -> None:
        self.config = config
        self.context = context
        self.recipe = context.recipe

    def needed_capabilities(self) -> dict[str, str]:
        """The engine capabilities this run of the scheduler needs, with reasons."""
        return dict(self.engine_needs)

    @abstractmethod
    def run(self) -> dict[str, Any]:
        """Train until ``trainer.total_training_steps`` (or epochs) are done; return the last
        step's metrics. Call ``context.step_end(step, metrics)`` after every step."""
