"""The run loop: everything around the training steps, the same for every scheduler.

Build the parts, resume from the checkpoint ``trainer.resume_mode`` names, start the scheduler,
give the engines the actor's weights, validate before training, then one
:meth:`Scheduler.train_step <plugrl.parts.scheduler.Scheduler.train_step>` after another, each
followed by validation (``trainer.test_freq`` and the last step), the run's clock and the
driver's memory (``perf/wall_clock_s``, ``perf/driver_rss_gb``), the learning-health checks
(:mod:`plugrl.run.health`), the step's log line and observers, and a checkpoint
(``trainer.save_freq`` and the last step); at the end the actor is exported
(``trainer.export_hf``) and the validation summary printed.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from plugrl.run.health import HealthMonitor
from plugrl.run.metrics import resident_memory_gb
from plugrl.run.steps import validate

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts
    from plugrl.parts.scheduler import Scheduler
    from plugrl.run.runner import RunContext

logger = logging.getLogger("plugrl.run")


class WallClock:
    """``perf/wall_clock_s``: seconds since the run started, over all its segments. A resumed
    run goes on from its checkpoint's clock: the time between that checkpoint and the
    interruption is not counted, as those steps are done again and counted then."""

    def __init__(self, before: float = 0.0) -> None:
        self.before = before
        self.segment_start = time.monotonic()

    def __call__(self) -> float:
        return self.before + time.monotonic() - self.segment_start


def run_loop(context: RunContext, scheduler: Scheduler) -> dict[str, Any]:
    """Run ``scheduler``'s steps to the end of the run; returns the last step's metrics."""
    clock = WallClock()
    # the checks are cheap: built before the parts, a broken one stops the run at once
    health = HealthMonitor.from_recipe(context.recipe, context.plugins, context.run_dir)
    parts = context.build_parts(scheduler.needed_capabilities())
    try:
        context.plugins.hook.on_run_start(recipe=context.recipe, run_dir=context.run_dir)
        try:
            return _train(context, scheduler, parts, clock, health)
        finally:
            scheduler.close()
    finally:
        parts.close()


def _train(
    context: RunContext,
    scheduler: Scheduler,
    parts: RunParts,
    clock: WallClock,
    health: HealthMonitor,
) -> dict[str, Any]:
    trainer = context.recipe.trainer
    state = parts.resume() or {}
    step = int(state.get("step", 0))
    clock.before = float(state.get("wall_clock_s", 0.0))
    history: list[dict[str, float]] = list(state.get("validation", []))
    # a checkpoint written before the checks kept state has none: they start afresh
    health.load_state_dict(state.get("health"))
    total = scheduler.total_steps(parts)
    if step >= total:
        logger.info(
            "the run in %s already finished its %d steps; set trainer.resume_mode=disable "
            "(or another trainer.default_local_dir) to train again",
            context.run_dir,
            total,
        )
    scheduler.start(parts, step, state.get("scheduler") if state else None)
    parts.sync_weights()
    if step == 0 and trainer.val_before_train and parts.val_data is not None:
        before = validate(parts, context.recipe, step)
        before["perf/wall_clock_s"] = clock()
        history.append(before)
        context.step_end(0, before)
    metrics: dict[str, Any] = {}
    progress = _progress(total, step)
    try:
        while step < total:
            done = scheduler.train_step(parts, step + 1)
            if done is None:
                logger.info(
                    "the scheduler has no more samples to train on; the run ends at step %d",
                    step,
                )
                break
            step, metrics = step + 1, done
            last = step == total
            if parts.val_data is not None and (
                last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)
            ):
                validation = validate(parts, context.recipe, step)
                history.append(validation)
                metrics.update(validation)
            metrics["perf/wall_clock_s"] = clock()
            resident = resident_memory_gb()
            if resident is not None:
                metrics["perf/driver_rss_gb"] = resident
            # the checks see the step before it is logged, so health/* lands in this step
            alarms = health.observe(step, metrics)
            # logged before the checkpoint that covers it: a run killed between the two
            # resumes from the checkpoint before and logs the step again in its place
            context.step_end(step, metrics)
            health.raise_if_stopping(alarms)
            if last or (trainer.save_freq > 0 and step % trainer.save_freq == 0):
                parts.save_checkpoint(
                    step,
                    {
                        "validation": history,
                        "wall_clock_s": clock(),
                        "scheduler": scheduler.checkpoint_state(),
                        "health": health.state_dict(),
                    },
                )
            if progress is not None:
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
    if trainer.export_hf:
        export_dir = context.run_dir / "hf_model"
        parts.actor.export_hf(export_dir)
        logger.info("exported the trained actor to %s", export_dir)
    _print_validation_summary(history)
    return metrics


def _progress(total: int, done: int) -> Any:
    if not sys.stderr.isatty():
        return None  # logs and CI get the per-step summary lines only
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="training", unit="step", dynamic_ncols=True)


def _print_validation_summary(history: list[dict[str, float]]) -> None:
    """``val-core/...: 0.289 -> 0.730 (+44.1 points)`` for each core validation metric the
    first and the last validation both measured."""
    if len(history) < 2:
        return
    first, last = history[0], history[-1]
    for key in sorted(last):
        if key.startswith("val-core/") and key in first and not math.isnan(first[key]):
            before, after = first[key], last[key]
            print(
                f"{key}: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)",
                file=sys.stderr,
                flush=True,
            )
