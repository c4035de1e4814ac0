"""The pieces of a training step every scheduler shares, whatever order it runs them in:
sampling (a seed per step, a batch from the engines), scoring, the old-log-prob pass, the
update from a scored batch, the step's metrics, and validation.

A synchronous step is, in order::

    params = sampling_params(recipe, step)
    batch = generate(parts, parts.train_loader.next_batch(), params)
    metrics = score(parts, batch)
    parts.before_training()
    if not parts.old_log_probs_from_update:
        metrics |= compute_old_log_probs(parts, batch, timer)
    metrics |= update_from_batch(parts, batch, timer)
    parts.weight_version += 1
    metrics |= parts.sync_weights()
    metrics |= step_metrics(parts, batch, timer, step)
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.plugin.boundaries import check_estimator_output, check_reward_output
from plugrl.run.sample_dump import prompt_text, sample_rows, write_jsonl
from plugrl.state.seeds import Stream, round_seed, sampling_seed

if TYPE_CHECKING:
    from plugrl.compose.run_parts import RunParts
    from plugrl.data.batch import Batch
    from plugrl.parts.reward import RewardOutput
    from plugrl.parts.rollout import Completion, SamplingParams
    from plugrl.recipe import Recipe
    from plugrl.run.metrics import StepTimer

logger = logging.getLogger("plugrl.run")  # where a run's progress lines go

REWARD_EXTRA_KEY = "reward_extra_columns"
"""The ``meta`` key under which :func:`score` lists the reward's extra columns it added."""


def sampling_params(
    recipe: Recipe, step: int, round_index: int = 0, *, stream: Stream = Stream.ROLLOUT
) -> SamplingParams:
    """The recipe's training sampling (``rollout.n``, ``temperature``, ``top_p``, ...,
    ``data.max_response_length`` new tokens at most) seeded for generation round
    ``round_index`` of ``step`` (:func:`plugrl.state.seeds.round_seed`: every round of every step
    draws apart from the others and from validation), so a resumed run samples exactly what
    the uninterrupted one did. ``stream`` puts the seed on another stream of
    :class:`plugrl.state.seeds.Stream`, ``step`` then being the position in it (a sample's
    number)."""
    params = recipe.rollout.sampling_params(recipe.data.max_response_length)
    if stream == Stream.ROLLOUT:
        params.seed = round_seed(recipe.trainer.seed, step, round_index)
    elif round_index:
        raise ValueError(
            f"generation rounds are training's (stream ROLLOUT); got round {round_index} on "
            f"stream {stream.name}"
        )
    else:
        params.seed = sampling_seed(recipe.trainer.seed, stream, step)
    return params


def generate(parts: RunParts, prompts: Batch, params: SamplingParams) -> Batch:
    """``params.n`` responses to each prompt of ``prompts`` (a batch of the prompt loader)
    from the engines, as a batch in verl's layout: the prompts' columns repeated per response,
    ``responses``, ``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids``,
    ``rollout_log_probs``, and ``meta["temperature"]``, the temperature log-probs are
    recomputed at.

    When the run scores early (:func:`scores_early`), each prompt's responses go to the
    reward manager's ``prefetch`` as soon as they finish; the caller then scores the batch
    (:func:`score`, :func:`reward_output`), which takes those results."""
    from plugrl.data.batch import IMAGES_COLUMN, MULTIMODAL_COLUMN, VIDEOS_COLUMN
    from plugrl.data.rollout_batch import build_rollout_batch

    loop_names = agent_loop_names(parts, prompts)
    if loop_names is not None:
        return generate_with_agents(parts, prompts, params, loop_names)
    prompt_ids = list(prompts["raw_prompt_ids"])
    # a vision-language model's rows: each prompt's image inputs go with its request
    images: dict[str, Any] = {}
    if MULTIMODAL_COLUMN in prompts:
        images["images"] = list(prompts[MULTIMODAL_COLUMN])
    if IMAGES_COLUMN in prompts:
        images["encoded_images"] = list(prompts[IMAGES_COLUMN])
    if VIDEOS_COLUMN in prompts:
        images["encoded_videos"] = list(prompts[VIDEOS_COLUMN])
    if scores_early(parts):

        def on_finished(index: int, completions: list[Completion]) -> None:
            prefetch_scores(parts, prompts.select([index]), completions, params.n)

        completions = parts.engines.generate(prompt_ids, params, on_finished=on_finished, **images)
    else:
        completions = parts.engines.generate(prompt_ids, params, **images)
    batch = build_rollout_batch(prompts, completions, n=params.n, pad_token_id=parts.pad_token_id)
    batch = parts.with_model_positions(batch)
    batch.meta["temperature"] = params.temperature or 1.0
    return batch


SINGLE_TURN = "single_turn"
"""The agent loop of a run without agents: rows that use only it take the batched path."""


def row_loop_names(parts: RunParts, prompts: Batch) -> list[str]:
    """The agent loop of each row of ``prompts``: its ``agent_name``, else
    ``rollout.agent.loop``."""
    default = parts.recipe.rollout.agent.loop
    return [
        str(name) if name else default for name in prompts.get("agent_name", [None] * len(prompts))
    ]


def agent_loop_names(parts: RunParts, prompts: Batch) -> list[str] | None:
    """The agent loop of each row of ``prompts`` (:func:`row_loop_names`), or ``None`` when
    every row's is ``single_turn``: those are sampled as one batch of requests, as a run
    without agents is."""
    names = row_loop_names(parts, prompts)
    registry = parts.plugins.registry("agent_loops")
    if all(registry.get(name).name == SINGLE_TURN for name in set(names)):
        return None
    return names


def run_uses_agents(parts: RunParts) -> bool:
    """Whether any training row needs an agent loop other than ``single_turn`` (by
    ``rollout.agent.loop`` or its ``agent_name``): a scheduler that samples prompt by prompt
    then runs every prompt through the agent runtime, so all its batches have one layout."""
    names = {parts.recipe.rollout.agent.loop}
    names.update(r.agent_name for r in parts.train_data.records if r.agent_name)
    registry = parts.plugins.registry("agent_loops")
    return any(registry.get(name).name != SINGLE_TURN for name in names)


def generate_with_agents(
    parts: RunParts, prompts: Batch, params: SamplingParams, loop_names: list[str]
) -> Batch:
    """:func:`generate` through the rows' agent loops: ``params.n`` trajectories per row,
    all running concurrently (:class:`plugrl.agents.session.AgentRuntime`), as a batch of
    :func:`plugrl.agents.batch.build_trajectory_batch`. Responses go to the reward manager
    when the batch is scored, not as they finish."""
    from plugrl.agents.batch import agent_rows, build_trajectory_batch, check_not_all_errors

    samples = parts.agent_runtime().run(agent_rows(prompts), loop_names, params)
    check_not_all_errors(t for row in samples for sample in row for t in sample)
    batch = build_trajectory_batch(prompts, samples, pad_token_id=parts.pad_token_id)
    batch = parts.with_model_positions(batch)
    batch.meta["temperature"] = params.temperature or 1.0
    return batch


def scores_early(parts: RunParts) -> bool:
    """Whether responses are handed to the reward manager as they finish: ``reward.overlap``
    is on and the manager implements :meth:`~plugrl.parts.reward.RewardManager.prefetch`."""
    from plugrl.parts.reward import RewardManager

    prefetch = getattr(type(parts.reward), "prefetch", RewardManager.prefetch)
    return bool(parts.recipe.reward.overlap) and prefetch is not RewardManager.prefetch


def prefetch_scores(
    parts: RunParts, prompt: Batch, completions: Sequence[Completion], n: int
) -> None:
    """Hand one prompt's ``n`` finished ``completions`` (``prompt`` is its one row of a
    prompt batch) to the reward manager's ``prefetch``, as the rows the batch will hold."""
    import attrs

    from plugrl.data.rollout_batch import build_rollout_batch

    # copies: the engine group numbers the originals by their place in the whole batch
    group = [
        attrs.evolve(completion, prompt_index=0)
        for completion in sorted(completions, key=lambda c: c.sample_index)
    ]
    rows = build_rollout_batch(prompt, group, n=n, pad_token_id=parts.pad_token_id)
    parts.reward.prefetch(parts.with_model_positions(rows))


def reward_output(parts: RunParts, batch: Batch) -> RewardOutput:
    """What the run's reward manager says of every response of ``batch``, checked: scores of
    the wrong shape or type stop the run with one line naming the manager
    (:func:`plugrl.plugin.boundaries.check_reward_output`). For a batch of trajectories
    the scores move where the trajectory says (:func:`plugrl.agents.batch.agent_scores`:
    episode rewards, per-turn rewards, the score on the last sampled token), and the manager
    scores only the samples whose trajectory gave no episode reward: an environment's reward
    is enough, with no reward function for the row's ``data_source``."""
    if "turn_rewards" not in batch:
        return check_reward_output(
            parts.reward(batch), batch, parts.recipe.reward.manager, parts.plugins
        )
    from plugrl.agents.batch import agent_scores, rows_to_score
    from plugrl.parts.reward import RewardOutput

    wanted = rows_to_score(batch)
    if len(wanted) == len(batch):
        output = _scored_rows(parts, batch)
    else:
        import torch

        scores = torch.zeros(batch["responses"].shape, dtype=torch.float32)
        output = RewardOutput(token_level_scores=scores)
        if wanted:
            part = _scored_rows(parts, batch.select(wanted))
            scores[wanted] = part.token_level_scores.to(torch.float32)
            for name, values in part.extra.items():
                column: list[Any] = [None] * len(batch)
                for row, value in zip(wanted, values, strict=True):
                    column[row] = value
                output.extra[name] = column
            output.metrics = dict(part.metrics)
    output.token_level_scores = agent_scores(batch, output.token_level_scores)
    return output


def _scored_rows(parts: RunParts, batch: Batch) -> RewardOutput:
    """The reward manager's output for the trajectory rows ``batch``; a data source without a
    reward function says the trajectories gave no reward of their own."""
    from plugrl.errors import DataError

    try:
        return check_reward_output(
            parts.reward(batch), batch, parts.recipe.reward.manager, parts.plugins
        )
    except DataError as exc:
        raise DataError(
            f"{exc} (these trajectories gave no episode reward of their own: an environment "
            "that returns one needs no reward function)"
        ) from None


def score(parts: RunParts, batch: Batch) -> dict[str, Any]:
    """Score every response with the run's reward manager: ``token_level_scores`` [B, R], and
    the manager's extra per-response columns (``acc``, ...) that the batch lacks. Returns the
    manager's metrics."""
    output = reward_output(parts, batch)
    batch["token_level_scores"] = output.token_level_scores
    added = []
    for name, values in output.extra.items():
        if len(values) == len(batch) and name not in batch:
            batch[name] = values
            added.append(name)
    batch.meta[REWARD_EXTRA_KEY] = added
    return dict(output.metrics)


def estimator_needs_sum_pi_squared(parts: RunParts) -> bool:
    """Whether the run's advantage estimator reads ``sum_pi_squared`` (its ``requires``)."""
    return "sum_pi_squared" in getattr(parts.estimator, "requires", ())


def compute_old_log_probs(parts: RunParts, batch: Batch, timer: StepTimer) -> dict[str, Any]:
    """``old_log_probs``: the actor's log-probs of the sampled tokens on its current weights
    (``timing_s/old_log_prob``, ``actor/entropy``). A synchronous step skips this pass when
    the update derives them from its own forward, on the same weights
    (:attr:`RunParts.old_log_probs_from_update
    <plugrl.compose.run_parts.RunParts.old_log_probs_from_update>`)."""
    metrics: dict[str, Any] = {}
    # the optimal token baseline reads each position's sum of squared probabilities, which
    # only this pass over the whole vocabulary can give
    extra = {"calculate_sum_pi_squared": True} if estimator_needs_sum_pi_squared(parts) else {}
    with timer("old_log_prob"):
        computed = parts.actor.compute_log_prob(batch, calculate_entropy=True, **extra)
        batch["old_log_probs"] = computed["log_probs"]
        if "sum_pi_squared" in computed:
            batch["sum_pi_squared"] = computed["sum_pi_squared"]
        if "entropys" in computed:
            mask = batch["response_mask"].bool()
            metrics["actor/entropy"] = computed["entropys"][mask].mean().item()
    metrics.update(check_rollout_log_probs(parts, batch))
    return metrics


def check_rollout_log_probs(parts: RunParts, batch: Batch) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_*`` and ``training/rollout_actor_probs_pearson_corr``
    of a batch holding both the engine's ``rollout_log_probs`` and the trainer's
    ``old_log_probs`` (:func:`plugrl.cluster.weight_check.rollout_probs_diff_metrics`), and
    ``trainer.check_weight_sync`` applied to them (:mod:`plugrl.cluster.weight_check`): only the
    responses sampled wholly on the weights the trainer holds now are checked (an
    asynchronous run's older ones differ by design), and only when the engine's probabilities
    are the trainer's distribution (no top-p or top-k truncation, not greedy)."""
    from plugrl.cluster.weight_check import rollout_probs_diff_metrics

    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    mask = batch["response_mask"]
    metrics = rollout_probs_diff_metrics(batch["rollout_log_probs"], batch["old_log_probs"], mask)
    trainer = parts.recipe.trainer
    rollout = parts.recipe.rollout
    truncated = rollout.top_p < 1 or rollout.top_k > 0 or not rollout.do_sample
    if trainer.check_weight_sync == "off" or truncated or not metrics:
        return metrics
    checked = metrics
    if "min_weight_version" in batch:
        import torch

        current = [int(v) == parts.weight_version for v in batch["min_weight_version"]]
        if not all(current):
            rows = torch.tensor(current, dtype=torch.bool, device=mask.device)
            checked = rollout_probs_diff_metrics(
                batch["rollout_log_probs"], batch["old_log_probs"], mask * rows[:, None]
            )
    check_weight_sync(parts, checked)
    return metrics


def check_weight_sync(parts: RunParts, metrics: dict[str, Any]) -> None:
    """``trainer.check_weight_sync`` on a step's ``training/rollout_probs_diff_mean``
    (:func:`plugrl.cluster.weight_check.check_probs_diff`), unless sampling truncated the
    distribution (top-p, top-k, greedy), whose log-probs are not the trainer's."""
    from plugrl.cluster.weight_check import check_probs_diff

    trainer = parts.recipe.trainer
    rollout = parts.recipe.rollout
    if rollout.top_p < 1 or rollout.top_k > 0 or not rollout.do_sample:
        return
    check_probs_diff(
        metrics,
        mode=trainer.check_weight_sync,
        thresholds=trainer.weight_sync_thresholds,
        engine=rollout.engine,
        dtype=rollout.resolved_dtype(parts.device),
        weight_version=parts.weight_version,
    )


def step_metrics(parts: RunParts, batch: Batch, timer: StepTimer, step: int) -> dict[str, Any]:
    """What every step logs of the batch it trained on: scores, rewards, advantages and
    lengths (``critic/*``, ``response_length/*``, ``prompt_length/*``), the timer's phases
    (``timing_s/*``, ``step`` included: call this after the timed step ends), throughput,
    device memory, for a batch of trajectories ``agent/*``
    (:func:`plugrl.agents.batch.agent_metrics`), ``training/global_step`` and
    ``training/epoch``. With
    ``trainer.rollout_data_dir`` set it also writes the batch's responses to
    ``<rollout_data_dir>/<step>.jsonl`` (:mod:`plugrl.run.sample_dump`)."""
    from plugrl.run.metrics import compute_data_metrics, compute_throughput_metrics

    data = parts.recipe.data
    metrics = compute_data_metrics(batch, data.max_response_length, data.max_prompt_length)
    if "num_turns" in batch:
        from plugrl.agents.batch import agent_metrics

        metrics.update(agent_metrics(batch))
        if parts.agents is not None:
            metrics.update(parts.agents.take_tool_metrics())
    metrics.update(timer.metrics())
    num_tokens = int(batch["attention_mask"].sum().item())
    metrics.update(
        compute_throughput_metrics(num_tokens, timer.seconds["step"], parts.actor.world_size)
    )
    metrics.update(parts.device.memory_metrics())
    metrics["training/global_step"] = step
    metrics["training/epoch"] = parts.train_loader.epoch
    folder = parts.recipe.trainer.rollout_data_dir
    if folder:
        extra = {name: batch[name] for name in batch.meta.get(REWARD_EXTRA_KEY, [])}
        scores = batch["token_level_scores"].sum(dim=-1).tolist()
        rows = sample_rows(parts.tokenizer, batch, scores, extra, step)
        write_jsonl(Path(folder) / f"{step}.jsonl", rows)
    return metrics


def update_from_batch(parts: RunParts, batch: Batch, timer: StepTimer) -> dict[str, Any]:
    """Train on a scored batch that holds ``old_log_probs``: reference log-probs and values
    when the run has those roles, KL in the reward, advantages, then the critic's and the
    actor's updates, each timed under its verl phase name. Returns their metrics."""
    metrics: dict[str, Any] = {}
    if parts.teachers is not None:
        with timer("teacher"):
            metrics.update(score_with_teachers(parts, batch))
    if parts.ref is not None:
        with timer("ref"):
            batch["ref_log_prob"] = parts.ref.compute_log_prob(batch)["log_probs"]
    elif parts.ref_in_actor:
        with timer("ref"):
            batch["ref_log_prob"] = parts.actor.compute_ref_log_prob(batch)["log_probs"]
    if parts.critic is not None:
        with timer("values"):
            batch["values"] = parts.critic.compute_values(batch)
    with timer("adv"):
        if parts.kl_in_reward is not None:
            metrics.update(parts.kl_in_reward(batch))
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        batch["advantages"], batch["returns"] = check_estimator_output(
            parts.estimator.compute(batch),
            batch,
            parts.recipe.algorithm.adv_estimator,
            parts.plugins,
        )
    if parts.critic is not None:
        with timer("update_critic"):
            metrics.update(parts.critic.update_critic(batch))
    derives_old_log_probs = "old_log_probs" not in batch
    with timer("update_actor"):
        metrics.update(parts.actor.update_policy(batch, parts.objective))
    if derives_old_log_probs and "training/rollout_probs_diff_mean" in metrics:
        # the update's own forward stood in for the old_log_prob pass and compared the
        # engine's log-probs with the trainer's (the mean only)
        check_weight_sync(parts, metrics)
    return metrics


def score_with_teachers(parts: RunParts, batch: Batch) -> dict[str, Any]:
    """``teacher_log_probs``: the distillation teachers' log-probs of the sampled tokens
    (:mod:`plugrl.compose.teachers`), and the spread of the per-token estimates the actor's
    distillation term starts from, ``actor/distillation/loss_{min,max}``, where the batch
    holds the student's ``old_log_probs``."""
    from plugrl.algorithms.distillation import TEACHER_LOG_PROBS, estimate_stats

    assert parts.teachers is not None
    batch[TEACHER_LOG_PROBS] = parts.teachers.score(batch)
    if "old_log_probs" not in batch:
        return {}
    config = parts.recipe.distillation.loss
    penalty = parts.plugins.registry("kl_penalties").load(config.loss_mode)
    return estimate_stats(
        config, penalty, batch["old_log_probs"], batch[TEACHER_LOG_PROBS], batch["response_mask"]
    )


def validate(parts: RunParts, recipe: Recipe, step: int) -> dict[str, float]:
    """Score the validation set with ``rollout.val_kwargs`` sampling on the engines' current
    weights: ``val-core/<data_source>/acc/mean@N`` (``reward`` when a scorer gives no
    ``acc``) and ``val-aux/<data_source>/score/mean@N``. The first
    ``trainer.log_val_generations`` samples are logged; with ``trainer.validation_data_dir``
    set every response is written to ``<validation_data_dir>/val_<step>.jsonl``."""
    import numpy as np

    from plugrl.data.dataset import PromptLoader

    loader = PromptLoader.for_validation(parts.val_data, recipe.data, parts.pad_token_id)
    params = recipe.rollout.sampling_params(recipe.data.max_response_length, validate=True)
    params.seed = sampling_seed(recipe.trainer.seed, Stream.VALIDATION, step)
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    samples_left = recipe.trainer.log_val_generations
    dump_folder = recipe.trainer.validation_data_dir
    dumped: list[dict[str, Any]] = []
    for prompts in loader:
        batch = generate(parts, prompts, params)
        output = reward_output(parts, batch)
        scores = output.token_level_scores.sum(dim=-1).tolist()
        accuracy = output.extra.get("acc")
        for row, data_source in enumerate(batch["data_source"]):
            values[(data_source, "score")].append(scores[row])
            if accuracy is not None:
                values[(data_source, "acc")].append(float(accuracy[row]))
        if samples_left > 0:
            samples_left = _log_generations(parts, batch, scores, samples_left)
        if dump_folder:
            dumped += sample_rows(parts.tokenizer, batch, scores, output.extra, step)
    if dump_folder:
        write_jsonl(Path(dump_folder) / f"val_{step}.jsonl", dumped)
    metrics: dict[str, float] = {}
    for (data_source, name), items in sorted(values.items()):
        core = name == "acc" or (name == "score" and (data_source, "acc") not in values)
        label = name if name == "acc" or not core else "reward"
        group = "val-core" if core else "val-aux"
        metrics[f"{group}/{data_source}/{label}/mean@{params.n}"] = float(np.mean(items))
    return metrics


def _log_generations(parts: RunParts, batch: Batch, scores: list[float], left: int) -> int:
    from plugrl.data.batch import response_attention_mask

    for row in range(min(left, len(batch))):
        mask = response_attention_mask(batch)[row].bool()
        prompt = prompt_text(parts.tokenizer, batch, row)
        response = parts.tokenizer.decode(
            batch["responses"][row][mask].tolist(), skip_special_tokens=True
        )
        logger.info("[validation] %r -> %r (score %.2f)", prompt[-80:], response[:200], scores[row])
    return left - min(left, len(batch))
