"""Schedulers: what one training step does (generate, score, estimate, update, sync weights).

The core owns the run around the steps (:func:`plugrl.run.loop.run_loop`): building the parts,
resuming, the first weight sync, validation, logging, checkpoints, export. A scheduler only
says what a step is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.config import option

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts
    from plugrl.run.runner import RunContext


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
    """What one training step does. Built in the driver as ``Scheduler(config, context)``:
    ``config`` is the ``scheduler`` section read into the scheduler's config class,
    ``context`` the :class:`~plugrl.run.runner.RunContext`. Raise a
    :class:`~plugrl.errors.RecipeError` in ``__init__`` for a recipe the scheduler cannot
    run: nothing is built or written yet.

    The core's run loop (:func:`plugrl.run.loop.run_loop`) builds the run's parts (with the engine
    capabilities :meth:`needed_capabilities` asks for), loads the checkpoint, calls
    :meth:`start`, gives the engines the actor's weights, validates, then calls
    :meth:`train_step` for each step until :meth:`total_steps` are done or it returns
    ``None``; after each step it validates (``trainer.test_freq``), logs, and saves a
    checkpoint holding :meth:`checkpoint_state` (``trainer.save_freq``); at the end it exports
    the actor and calls :meth:`close`, also when the run fails.
    """

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

    def total_steps(self, parts: RunParts) -> int:
        """How many training steps the run takes: ``trainer.total_training_steps``, or
        ``trainer.total_epochs`` of ``data.train_batch_size`` prompts a step."""
        return parts.total_training_steps

    def start(self, parts: RunParts, step: int, saved: dict[str, Any] | None) -> None:
        """Called once, after the checkpoint (if any) is loaded and before the engines get
        the actor's weights. ``step`` is the last step done (0 on a fresh run); ``saved`` is
        what :meth:`checkpoint_state` returned when that checkpoint was written, ``None`` on
        a fresh run. Restore your own state here."""

    @abstractmethod
    def train_step(self, parts: RunParts, step: int) -> dict[str, Any] | None:
        """Train step ``step`` (counted from 1) and return its metrics (verl's names,
        scalars), or ``None`` when there are no more samples to train on (the run then ends
        at the step before). After training, give the engines the new weights
        (``parts.weight_version += 1; parts.sync_weights()``) when the next step samples
        from them."""

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this scheduler (plain values: numbers, strings, lists,
        dicts), handed back to :meth:`start` on resume."""
        return {}

    def close(self) -> None:
        """Stop what the scheduler started (threads, queues); called once at the end of the
        run, also a failed one, before the parts are closed."""
