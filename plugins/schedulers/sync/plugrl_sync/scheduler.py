"""The sync scheduler: generate, score, estimate, update, sync weights, one step after another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from plugrl.api.scheduler import (
    DynamicSampler,
    Scheduler,
    StepTimer,
    compute_old_log_probs,
    generate,
    reward_output,
    sampling_params,
    score,
    step_metrics,
    update_from_batch,
)

if TYPE_CHECKING:
    from plugrl.api.data import Batch
    from plugrl.api.rollout import SamplingParams
    from plugrl.api.scheduler import RunParts


class SyncScheduler(Scheduler):
    """verl's synchronous PPO/GRPO step.

    Per step: ``gen`` (sample ``rollout.n`` responses per prompt), ``reward``,
    ``old_log_prob``, ``ref``, ``values``, ``adv`` (KL in reward, advantages),
    ``update_critic``, ``update_actor``, ``update_weights``. With DAPO's dynamic sampling
    (``algorithm.filter_groups``) it generates as many rounds as it takes to collect
    ``data.train_batch_size`` groups whose metric is not all equal; ReMax's baselines come
    from a greedy response per prompt.

    When the update is one optimizer step over the batch, ``old_log_prob`` is skipped and the
    actor update takes them from its own forward, which runs on the same weights
    (:func:`plugrl.compose.run_parts.update_derives_old_log_probs`). It asks nothing of the
    engine beyond sampling; engines that do not share the trainer's model receive weights
    after every step.
    """

    provides: ClassVar[frozenset[str] | None] = frozenset({"values", "reward_baselines"})

    def train_step(self, parts: RunParts, step: int) -> dict[str, Any]:
        timer = StepTimer()
        metrics: dict[str, Any] = {}
        with timer("step"):
            batch = self.rollout(parts, step, timer, metrics)
            if not parts.old_log_probs_from_update:
                metrics.update(compute_old_log_probs(parts, batch, timer))
            metrics.update(update_from_batch(parts, batch, timer))
            with timer("update_weights"):
                parts.weight_version += 1
                metrics.update(parts.sync_weights())
        metrics.update(step_metrics(parts, batch, timer, step))
        return metrics

    def rollout(
        self, parts: RunParts, step: int, timer: StepTimer, metrics: dict[str, Any]
    ) -> Batch:
        """Generate and score one training batch; with dynamic sampling, round after round
        until ``data.train_batch_size`` groups are kept (each round seeded apart)."""
        recipe = self.recipe
        sampler = (
            DynamicSampler.from_recipe(recipe) if recipe.algorithm.filter_groups.enable else None
        )
        round_index = 0
        while True:
            prompts = parts.train_loader.next_batch()
            params = sampling_params(recipe, step, round_index)
            with timer("gen"):
                batch = generate(parts, prompts, params)
            with timer("reward"):
                metrics.update(score(parts, batch))
            if "reward_baselines" in parts.estimator.requires:
                with timer("gen_baseline"):
                    batch["reward_baselines"] = self.greedy_baselines(parts, prompts, params)
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

    def greedy_baselines(self, parts: RunParts, prompts: Batch, params: SamplingParams) -> Any:
        """ReMax's baseline: the score of each prompt's greedy response, once per sample."""
        greedy_params = self.recipe.rollout.greedy_params(self.recipe.data.max_response_length)
        greedy = generate(parts, prompts, greedy_params)
        scores = reward_output(parts, greedy).token_level_scores.sum(dim=-1)
        return scores.repeat_interleave(params.n)
