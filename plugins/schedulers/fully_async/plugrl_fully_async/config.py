"""The ``scheduler`` section of ``scheduler: fully_async`` (verl's ``async_training`` keys)."""

from __future__ import annotations

import attrs

from plugrl.config import non_negative, option, positive
from plugrl.parts.scheduler import SchedulerConfig


@attrs.define(kw_only=True)
class FullyAsyncConfig(SchedulerConfig):
    """Rollout and training overlap; these keys bound how far the rollout may run ahead."""

    staleness_threshold: float = option(
        0.1,
        "How many samples beyond one weight-sync period the rollouter may generate ahead of "
        "the trainer, as a fraction of that period: max_required_samples = int(required_samples "
        "x (1 + staleness_threshold) x trigger_parameter_sync_step). 0 with "
        "trigger_parameter_sync_step 1 is one-step off-policy; more overlaps more and trains on "
        "older samples.",
        verl="async_training.staleness_threshold",
        validator=non_negative,
    )
    trigger_parameter_sync_step: int = option(
        1,
        "Trainer steps between two weight syncs to the engines (each sync makes a new weight "
        "version).",
        verl="async_training.trigger_parameter_sync_step",
        validator=positive,
    )
    require_batches: int = option(
        1,
        "Mini-batches of actor.ppo_mini_batch_size prompts per trainer step: required_samples "
        "= ppo_mini_batch_size x require_batches prompts (data.train_batch_size is not used).",
        verl="async_training.require_batches",
        validator=positive,
    )
    partial_rollout: bool = option(
        True,
        "At a weight sync, pause responses in flight and continue them with the new weights, "
        "keeping their tokens; false waits for them to finish before the sync (the trainer "
        "waits for the longest response).",
        verl="async_training.partial_rollout",
    )
    use_rollout_log_probs: bool = option(
        False,
        "Use the engines' log-probs of the sampled tokens as old log-probs (no recompute); "
        "false recomputes them with the trainer's current weights, and algorithm.rollout_is "
        "corrects against the rollout log-probs (the decoupled form).",
        verl="async_training.use_rollout_log_probs",
    )
    total_rollout_steps: int | None = option(
        None,
        "Prompts the rollouter generates in the whole run; the trainer then takes "
        "total_rollout_steps // required_samples steps (null: trainer.total_training_steps "
        "or epochs decide).",
        verl="rollout.total_rollout_steps",
        validator=positive,
    )
    max_in_flight_per_engine: int = option(
        16,
        "Prompts in flight on one engine at once (each with rollout.n responses); more keeps "
        "an engine's batch fuller, fewer makes samples fresher.",
        validator=positive,
    )
