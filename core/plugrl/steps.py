"""The parts of a training step every scheduler shares, whatever order it generates in: the
update from a scored batch, and validation."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from plugrl.compose.boundaries import check_estimator_output, check_reward_output

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts
    from plugrl.data.batch import Batch
    from plugrl.metrics import StepTimer
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.run")  # where a run's progress lines go

VALIDATION_SEED = 1
"""The stream of :func:`plugrl.compose.run_parts.sampling_seed` validation samples with, apart from
training's."""


def update_from_batch(parts: RunParts, batch: Batch, timer: StepTimer) -> dict[str, Any]:
    """Train on a scored batch that holds ``old_log_probs``: reference log-probs and values
    when the run has those roles, KL in the reward, advantages, then the critic's and the
    actor's updates, each timed under its verl phase name. Returns their metrics."""
    metrics: dict[str, Any] = {}
    if parts.ref is not None:
        with timer("ref"):
            batch["ref_log_prob"] = parts.ref.compute_log_prob(batch)["log_probs"]
    if parts.critic is not None:
        with timer("values"):
            batch["values"] = parts.critic.compute_values(batch)
    with timer("adv"):
        if parts.kl_in_reward is not None:
            metrics.update(parts.kl_in_reward(batch))
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        batch["advantages"], batch["returns"] = check_estimator_output(
            parts.estimator.compute(batch), batch, parts.recipe.algorithm.adv_estimator
        )
    if parts.critic is not None:
        with timer("update_critic"):
            metrics.update(parts.critic.update_critic(batch))
    with timer("update_actor"):
        metrics.update(parts.actor.update_policy(batch, parts.objective))
    return metrics


def validate(parts: RunParts, recipe: Recipe, step: int) -> dict[str, float]:
    """Score the validation set with ``rollout.val_kwargs`` sampling on the engines' current
    weights: ``val-core/<data_source>/acc/mean@N`` (``reward`` when a scorer gives no
    ``acc``) and ``val-aux/<data_source>/score/mean@N``. The first
    ``trainer.log_val_generations`` samples are logged."""
    import numpy as np

    from plugrl.compose.run_parts import sampling_seed
    from plugrl.data.dataset import PromptLoader
    from plugrl.data.rollout_batch import build_rollout_batch

    loader = PromptLoader.for_validation(parts.val_data, recipe.data, parts.pad_token_id)
    params = recipe.rollout.sampling_params(recipe.data.max_response_length, validate=True)
    params.seed = sampling_seed(recipe.trainer.seed, step, VALIDATION_SEED)
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    samples_left = recipe.trainer.log_val_generations
    for prompts in loader:
        completions = parts.engines.generate(list(prompts["raw_prompt_ids"]), params)
        batch = build_rollout_batch(
            prompts, completions, n=params.n, pad_token_id=parts.pad_token_id
        )
        output = check_reward_output(parts.reward(batch), batch, recipe.reward.manager)
        scores = output.token_level_scores.sum(dim=-1).tolist()
        accuracy = output.extra.get("acc")
        for row, data_source in enumerate(batch["data_source"]):
            values[(data_source, "score")].append(scores[row])
            if accuracy is not None:
                values[(data_source, "acc")].append(float(accuracy[row]))
        if samples_left > 0:
            samples_left = _log_generations(parts, batch, scores, samples_left)
    metrics: dict[str, float] = {}
    for (data_source, name), items in sorted(values.items()):
        core = name == "acc" or (name == "score" and (data_source, "acc") not in values)
        label = name if name == "acc" or not core else "reward"
        group = "val-core" if core else "val-aux"
        metrics[f"{group}/{data_source}/{label}/mean@{params.n}"] = float(np.mean(items))
    return metrics


def _log_generations(parts: RunParts, batch: Batch, scores: list[float], left: int) -> int:
    for row in range(min(left, len(batch))):
        mask = batch["response_mask"][row].bool()
        prompt = parts.tokenizer.decode(batch["raw_prompt_ids"][row], skip_special_tokens=True)
        response = parts.tokenizer.decode(
            batch["responses"][row][mask].tolist(), skip_special_tokens=True
        )
        logger.info("[validation] %r -> %r (score %.2f)", prompt[-80:], response[:200], scores[row])
    return left - min(left, len(batch))
