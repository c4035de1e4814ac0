"""A synchronous GRPO step that samples again, up to ``scheduler.max_rounds`` times, the
prompts whose responses all scored the same: such a group has no advantage to learn from."""

from collections import defaultdict

import attrs

from plugrl.api import non_negative, option
from plugrl.api.data import Batch
from plugrl.api.scheduler import (
    Scheduler,
    SchedulerConfig,
    StepTimer,
    compute_old_log_probs,
    generate,
    sampling_params,
    score,
    step_metrics,
    update_from_batch,
)


@attrs.define(kw_only=True)
class RegenerateConfig(SchedulerConfig):
    max_rounds: int = option(1, "Times a flat group is sampled again.", validator=non_negative)


class RegenerateScheduler(Scheduler):
    def train_step(self, parts, step):
        timer, metrics = StepTimer(), {}
        with timer("step"):
            prompts = parts.train_loader.next_batch()
            batch = generate(parts, prompts, sampling_params(self.recipe, step))
            metrics |= score(parts, batch)
            metrics["regenerate/flat_groups"] = len(flat := flat_groups(batch))
            for round_index in range(1, self.config.max_rounds + 1):
                if not flat:
                    break
                again = prompts.select([i for i, uid in enumerate(prompts["uid"]) if uid in flat])
                redo = generate(parts, again, sampling_params(self.recipe, step, round_index))
                metrics |= score(parts, redo)
                kept = [i for i, uid in enumerate(batch["uid"]) if uid not in flat]
                batch = Batch.concat([batch.select(kept), redo])
                flat = flat_groups(batch)
            metrics["regenerate/flat_groups_trained"] = len(flat)
            parts.before_training()
            if not parts.old_log_probs_from_update:
                metrics |= compute_old_log_probs(parts, batch, timer)
            metrics |= update_from_batch(parts, batch, timer)
            parts.weight_version += 1
            metrics |= parts.sync_weights()
        return metrics | step_metrics(parts, batch, timer, step)


def flat_groups(batch):
    """The ``uid`` of each prompt whose responses all have the same score."""
    scores = defaultdict(set)
    totals = batch["token_level_scores"].sum(-1).tolist()
    for uid, total in zip(batch["uid"], totals, strict=True):
        scores[uid].add(total)
    return {uid for uid, values in scores.items() if len(values) == 1}
