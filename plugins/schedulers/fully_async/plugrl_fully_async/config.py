"""The ``scheduler`` section of ``scheduler: fully_async`` (verl's ``async_training`` keys)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.api import ConfigValueError, non_negative, option, positive
from plugrl.api.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from plugrl.api import Recipe

# the logger of the recipe's own warnings (plugrl.recipe.checks): these are warnings about the
# recipe too, only ones that need the run's length
logger = logging.getLogger("plugrl.recipe")


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
    # null, "auto" or an int: no one type the recipe reader converts to, so the value is read
    # as written and check_lag_bound decides
    max_version_lag: Any = option(
        None,
        "A strict bound on the lag of every trained sample, in weight versions by its oldest "
        "token: a sample that would lag more is dropped (ended while generating when that is "
        "certain). null: off, verl's rule (staleness_threshold bounds only what starts, every "
        "finished sample trains and importance correction handles its lag); auto: "
        "ceil(max_required_samples / (required_samples x trigger_parameter_sync_step)); or a "
        "number of versions. Strict bounds drop long responses more than short ones.",
        validator=lambda instance, attribute, value: check_lag_bound(attribute.name, value),
    )
    max_in_flight_per_engine: int = option(
        16,
        "Prompts in flight on one engine at once (each with rollout.n responses); more keeps "
        "an engine's batch fuller, fewer makes samples fresher.",
        validator=positive,
    )


def check_lag_bound(name: str, value: Any) -> None:
    """Raise a :class:`ConfigValueError` naming ``name`` unless ``value`` is a value of
    ``max_version_lag``: ``None``, ``"auto"`` or an integer of 1 or more."""
    if value is None or value == "auto":
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return
    raise ConfigValueError(
        name,
        f"must be null (off), auto or a number of weight versions of 1 or more, got {value!r}",
    )


def warn_meaningless_bounds(
    config: FullyAsyncConfig, recipe: Recipe, total_steps: int, dataset_size: int | None = None
) -> None:
    """Warn (logger ``plugrl.recipe``, one line each) about keys whose value makes their bound
    mean nothing for a run of ``total_steps`` trainer steps over ``dataset_size`` prompts
    (``None``: unknown):

    * ``staleness_threshold`` so large that ``max_required_samples`` exceeds the samples the
      whole run trains (or the dataset): the rollouter is never paused, and may generate the
      run (or an epoch) ahead of the trainer on old weights;
    * ``trigger_parameter_sync_step`` at or past the run's last step: no weight sync comes
      before the last step, so the engines generate every sample with the initial weights.

    A run of one step gets neither: all it trains was generated with the initial weights.

    Call it once the run's length is known, before training starts.
    """
    if total_steps <= 1:
        return  # one step trains the first weights' samples whatever the keys say
    required = recipe.actor.ppo_mini_batch_size * config.require_batches
    sync_step = config.trigger_parameter_sync_step
    threshold = config.staleness_threshold
    # verl's int() of the product; a threshold near the largest float makes it infinite
    product = required * (1 + threshold) * sync_step
    max_required = int(product) if math.isfinite(product) else math.inf
    run_samples = total_steps * required
    limits = [
        (
            run_samples,
            f"the {run_samples} samples the whole run trains ({total_steps} steps x "
            f"required_samples {required})",
        )
    ]
    if dataset_size is not None:
        limits.append((dataset_size, f"the {dataset_size} prompts of the training data"))
    limit, what = min(limits)
    # blamed on the threshold only when one weight period alone fits: a period as long as
    # the run is the sync step's doing, warned about below
    if required * sync_step < limit < max_required:
        shown = str(max_required) if max_required < 1e15 else f"{max_required:.3g}"
        logger.warning(
            "%s: %s",
            "scheduler.staleness_threshold",
            f"{threshold:g} lets max_required_samples = int(required_samples {required} x (1 + "
            f"{threshold:g}) x trigger_parameter_sync_step {sync_step}) = {shown} exceed "
            f"{what}, so the bound never pauses the rollouter and samples may train on weights "
            "many versions old; lower it for the bound to hold",
        )
    if sync_step >= total_steps:
        logger.warning(
            "%s: %s",
            "scheduler.trigger_parameter_sync_step",
            f"{sync_step} is not below the run's {total_steps} trainer steps, so no weight "
            "sync comes before the last step and the engines generate every sample with the "
            f"initial weights; set it below {total_steps}",
        )
