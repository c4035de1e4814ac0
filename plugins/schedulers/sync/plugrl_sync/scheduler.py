"""The sync scheduler: generate, score, estimate, update, sync weights, one step after another."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, ClassVar

from plugrl.algorithms.dynamic_sampling import DynamicSampler
from plugrl.compose.run_parts import RunParts, sampling_seed
from plugrl.data.batch import Batch
from plugrl.data.rollout_batch import build_rollout_batch
from plugrl.metrics import StepTimer, compute_data_metrics, compute_throughput_metrics
from plugrl.parts.scheduler import Scheduler
from plugrl.steps import update_from_batch, validate

logger = logging.getLogger("plugrl.run")


class SyncScheduler(Scheduler):
    """verl's synchronous PPO/GRPO loop.

    Per step: ``gen`` (sample ``rollout.n`` responses per prompt), ``reward``,
    ``old_log_prob``, ``ref``, ``values``, ``adv`` (KL in reward, advantages),
    ``update_critic``, ``update_actor``, ``update_weights``; validation every
    ``trainer.test_freq`` steps (and before the first with ``val_before_train``, and after the
    last); a checkpoint every ``trainer.save_freq`` steps and after the last.

    When the update is one optimizer step over the batch, ``old_log_prob`` is skipped and the
    actor update takes them from its own forward, which runs on the same weights
    (:func:`plugrl.compose.run_parts.update_derives_old_log_probs`). It asks nothing of the
    engine beyond sampling; engines that do not share the trainer's model receive weights after
    every step.
    """

    provides: ClassVar[frozenset[str] | None] = frozenset({"values", "reward_baselines"})

    def run(self) -> dict[str, Any]:
        self._segment_start = time.perf_counter()
        self._wall_clock_before = 0.0
        parts = self.context.build_parts(self.needed_capabilities())
        try:
            return self._train(parts)
        finally:
            parts.close()

    # ------------------------------------------------------------------------------ the loop

    def _train(self, parts: RunParts) -> dict[str, Any]:
        trainer = self.recipe.trainer
        state = parts.resume()
        step = state["step"] if state else 0
        if step >= parts.total_training_steps:
            logger.info(
                "the run in %s already finished its %d steps; set trainer.resume_mode=disable "
                "(or another trainer.default_local_dir) to train again",
                self.context.run_dir,
                parts.total_training_steps,
            )
        validation_history: list[dict[str, float]] = list(
            state.get("validation", []) if state else []
        )
        # a resumed run's clock goes on from its checkpoint (the time between that checkpoint
        # and the interruption is not counted: those steps are redone and counted again)
        self._wall_clock_before = float(state.get("wall_clock_s", 0.0)) if state else 0.0
        parts.sync_weights()
        if step == 0 and trainer.val_before_train and parts.val_data is not None:
            before = self.validate(parts, step)
            validation_history.append(before)
            self.context.step_end(0, before)
        metrics: dict[str, Any] = {}
        progress = _progress(parts.total_training_steps, step)
        try:
            while step < parts.total_training_steps:
                step += 1
                metrics = self.train_step(parts, step)
                last = step == parts.total_training_steps
                if parts.val_data is not None and (
                    last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)
                ):
                    validation = self.validate(parts, step)
                    validation_history.append(validation)
                    metrics.update(validation)
                metrics["perf/wall_clock_s"] = self.wall_clock()
                # logged before the checkpoint that covers it: a run killed between the two
                # resumes from the checkpoint before and logs the step again in its place
                self.context.step_end(step, metrics)
                if last or (trainer.save_freq > 0 and step % trainer.save_freq == 0):
                    parts.save_checkpoint(
                        step,
                        {"validation": validation_history, "wall_clock_s": self.wall_clock()},
                    )
                if progress is not None:
                    progress.update(1)
            if trainer.export_hf:
                export_dir = self.context.run_dir / "hf_model"
                parts.actor.export_hf(export_dir)
                logger.info("exported the trained actor to %s", export_dir)
        finally:
            if progress is not None:
                progress.close()
        _print_validation_summary(validation_history)
        return metrics

    def wall_clock(self) -> float:
        """``perf/wall_clock_s``: seconds since the run started, over all its segments."""
        return self._wall_clock_before + time.perf_counter() - self._segment_start

    def train_step(self, parts: RunParts, step: int) -> dict[str, Any]:
        recipe = self.recipe
        timer = StepTimer()
        metrics: dict[str, Any] = {}
        with timer("step"):
            batch = self.rollout(parts, step, timer, metrics)
            if not parts.old_log_probs_from_update:
                with timer("old_log_prob"):
                    computed = parts.actor.compute_log_prob(batch, calculate_entropy=True)
                    batch["old_log_probs"] = computed["log_probs"]
                    if "entropys" in computed:
                        mask = batch["response_mask"].bool()
                        metrics["actor/entropy"] = computed["entropys"][mask].mean().item()
            metrics.update(update_from_batch(parts, batch, timer))
            with timer("update_weights"):
                parts.weight_version += 1
                metrics.update(parts.sync_weights())
        metrics.update(
            compute_data_metrics(
                batch, recipe.data.max_response_length, recipe.data.max_prompt_length
            )
        )
        metrics.update(timer.metrics())
        num_tokens = int(batch["attention_mask"].sum().item())
        metrics.update(
            compute_throughput_metrics(num_tokens, timer.seconds["step"], parts.actor.world_size)
        )
        metrics.update(parts.device.memory_metrics())
        metrics["training/global_step"] = step
        metrics["training/epoch"] = parts.train_loader.epoch
        return metrics

    def rollout(
        self, parts: RunParts, step: int, timer: StepTimer, metrics: dict[str, Any]
    ) -> Batch:
        """Generate and score one training batch; with DAPO dynamic sampling, as many rounds
        as it takes to collect ``data.train_batch_size`` groups that are not all equal."""
        recipe = self.recipe
        sampler = (
            DynamicSampler.from_recipe(recipe) if recipe.algorithm.filter_groups.enable else None
        )
        round_index = 0
        while True:
            prompts = parts.train_loader.next_batch()
            params = recipe.rollout.sampling_params(recipe.data.max_response_length)
            params.seed = sampling_seed(recipe.trainer.seed, step, round_index)
            with timer("gen"):
                completions = parts.engines.generate(list(prompts["raw_prompt_ids"]), params)
                batch = build_rollout_batch(
                    prompts, completions, n=params.n, pad_token_id=parts.pad_token_id
                )
                # log-probs are recomputed at the temperature the tokens were sampled with
                batch.meta["temperature"] = params.temperature or 1.0
            with timer("reward"):
                self.score(parts, batch, metrics)
            if "reward_baselines" in parts.estimator.requires:
                with timer("gen_baseline"):
                    batch["reward_baselines"] = self.greedy_baselines(parts, prompts, params.n)
            if sampler is None:
                parts.before_training()
                return batch
            metrics.update(sampler.add(batch))
            round_index += 1
            if sampler.ready:
                kept, sampler_metrics = sampler.take()
                metrics.update(sampler_metrics)
                parts.before_training()
                return kept

    def greedy_baselines(self, parts: RunParts, prompts: Batch, n: int) -> Any:
        """ReMax's baseline: the score of each prompt's greedy response, once per sample."""
        params = self.recipe.rollout.greedy_params(self.recipe.data.max_response_length)
        completions = parts.engines.generate(list(prompts["raw_prompt_ids"]), params)
        greedy = build_rollout_batch(prompts, completions, n=1, pad_token_id=parts.pad_token_id)
        scores = parts.reward(greedy).token_level_scores.sum(dim=-1)
        return scores.repeat_interleave(n)

    @staticmethod
    def score(parts: RunParts, batch: Batch, metrics: dict[str, Any]) -> None:
        output = parts.reward(batch)
        batch["token_level_scores"] = output.token_level_scores
        for name, values in output.extra.items():
            if len(values) == len(batch) and name not in batch:
                batch[name] = values
        metrics.update(output.metrics)

    # ------------------------------------------------------------------------------ validation

    def validate(self, parts: RunParts, step: int) -> dict[str, float]:
        return validate(parts, self.recipe, step)


def _progress(total: int, done: int) -> Any:
    if not sys.stderr.isatty():
        return None  # logs and CI get the per-step summary lines only
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="training", unit="step", dynamic_ncols=True)


def _print_validation_summary(history: list[dict[str, float]]) -> None:
    if len(history) < 2:
        return
    first, last = history[0], history[-1]
    for key in sorted(last):
        if key.startswith("val-core/") and key in first:
            before, after = first[key], last[key]
            print(
                f"{key}: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)",
                file=sys.stderr,
                flush=True,
            )
