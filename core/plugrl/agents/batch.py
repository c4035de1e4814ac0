"""Trajectories into a training batch in verl's layout, and the agent metrics of a batch.

A trajectory's ``response_ids`` hold every token after its prompt: the sampled ones
(``loss_mask`` 1) and those appended between turns (0). In the batch:

* ``response_mask`` is the loss mask: the tokens that are trained on (losses, KL penalties,
  entropy, advantages);
* ``attention_mask``'s response part is 1 on every response token, sampled or appended: the
  tokens the model reads, what a reward manager decodes, what ``response_length`` counts
  (:func:`plugrl.data.batch.response_attention_mask`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.parts.agent import Trajectory

AGENT_COLUMNS = ("num_turns", "episode_reward", "sample_last", "agent_metrics", "messages")
"""Non-tensor columns a batch built from trajectories has (besides the rollout ones):
turns per row, the episode reward (``None`` when the reward manager's score stands), whether
the row is the last sequence of its sample, the trajectory's metrics and its messages."""


def build_trajectory_batch(
    prompts: Batch,
    samples: Sequence[Sequence[Sequence[Trajectory]]],
    *,
    pad_token_id: int,
    response_width: int | None = None,
) -> Batch:
    """The batch of ``samples`` (for each row of ``prompts``, its samples, each a list of
    sequences): one batch row per sequence, the prompt row's columns repeated, grouped by
    prompt then sample. ``prompts`` is left-padded from each trajectory's own ``prompt_ids``
    (a loop's chat template may render the row differently, with its tools); tensors as
    :func:`plugrl.data.rollout_batch.build_rollout_batch` makes them, with ``response_mask``
    the loss mask, ``rollout_log_probs`` 0 off it, and ``turn_rewards`` [B, R] holding each
    turn's reward at the turn's last token. Columns: ``finish_reason``, ``weight_version``,
    ``min_weight_version`` (the oldest version of a sampled token), and
    :data:`AGENT_COLUMNS`; when a trajectory has images (or the prompts had), the
    ``multi_modal_inputs`` of each row are its trajectory's ``image_inputs`` joined in order
    (prompt images, then those of tool results and observations). ``position_ids`` count
    tokens; a vision-language model's own replace them
    (:func:`plugrl.data.multimodal.add_model_positions`)."""
    import torch

    from plugrl.data.batch import MULTIMODAL_COLUMN, left_pad
    from plugrl.data.multimodal import model_inputs
    from plugrl.data.rollout_batch import fit_response_width

    if len(samples) != len(prompts):
        raise ValueError(f"expected samples for {len(prompts)} prompts, got {len(samples)}")
    rows: list[int] = []
    flat: list[Trajectory] = []
    last: list[bool] = []
    for prompt_index, prompt_samples in enumerate(samples):
        for sequences in prompt_samples:
            for position, trajectory in enumerate(sequences):
                trajectory.check()
                rows.append(prompt_index)
                flat.append(trajectory)
                last.append(position == len(sequences) - 1)
    response_width = fit_response_width((len(t.response_ids) for t in flat), response_width)

    size = len(flat)
    responses = torch.full((size, response_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((size, response_width), dtype=torch.long)
    response_attention = torch.zeros((size, response_width), dtype=torch.long)
    log_probs = torch.zeros((size, response_width), dtype=torch.float32)
    turn_rewards = torch.zeros((size, response_width), dtype=torch.float32)
    for row, trajectory in enumerate(flat):
        length = len(trajectory.response_ids)
        if not length:
            continue
        mask = torch.tensor(trajectory.loss_mask, dtype=torch.long)
        responses[row, :length] = torch.tensor(trajectory.response_ids, dtype=torch.long)
        response_mask[row, :length] = mask
        response_attention[row, :length] = 1
        log_probs[row, :length] = torch.tensor(trajectory.log_probs, dtype=torch.float32) * mask
        for end, reward in zip(trajectory.turn_ends, trajectory.turn_rewards, strict=False):
            turn_rewards[row, end] += float(reward)

    batch = prompts.select(rows)
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in flat], pad_token_id)
    batch["prompts"] = prompt_ids
    batch["prompt_attention_mask"] = prompt_mask
    attention_mask = torch.cat([prompt_mask, response_attention], dim=-1)
    batch["responses"] = responses
    batch["response_mask"] = response_mask
    batch["input_ids"] = torch.cat([prompt_ids, responses], dim=-1)
    batch["attention_mask"] = attention_mask
    batch["position_ids"] = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    batch["rollout_log_probs"] = log_probs
    batch["turn_rewards"] = turn_rewards
    batch["finish_reason"] = [t.finish_reason for t in flat]
    batch["weight_version"] = [t.weight_version for t in flat]
    batch["min_weight_version"] = [min_sampled_version(t) for t in flat]
    batch["num_turns"] = [t.num_turns for t in flat]
    batch["episode_reward"] = [t.reward for t in flat]
    batch["sample_last"] = last
    batch["agent_metrics"] = [dict(t.metrics) for t in flat]
    batch["messages"] = [list(t.messages) for t in flat]
    # getattr: a trajectory saved by an older version (a resumed buffer) has no image inputs
    image_inputs = [getattr(t, "image_inputs", None) or [] for t in flat]
    if MULTIMODAL_COLUMN in batch or any(image_inputs):
        batch[MULTIMODAL_COLUMN] = [model_inputs(inputs) or None for inputs in image_inputs]
    batch.meta.update(
        prompt_width=int(prompt_ids.shape[-1]),
        response_width=response_width,
        pad_token_id=pad_token_id,
    )
    return batch


def min_sampled_version(trajectory: Trajectory) -> int:
    """The oldest weight version that sampled a token of ``trajectory`` (its
    ``weight_version`` when it sampled none): the trajectory's staleness."""
    sampled = [v for v, m in zip(trajectory.token_versions, trajectory.loss_mask, strict=True) if m]
    return min(sampled, default=trajectory.weight_version)


def check_not_all_errors(trajectories: Iterable[Trajectory]) -> None:
    """Stop the run (:class:`~plugrl.errors.PluginError`, one line) when every trajectory of
    a step ended in error: there is nothing to learn from, and training on it would pass a
    broken loop, environment or tool for a model that does badly."""
    trajectories = list(trajectories)
    if not trajectories or any(t.finish_reason != "error" for t in trajectories):
        return
    from plugrl.errors import PluginError

    # getattr: a trajectory saved by an older version (a resumed buffer) has no error field
    first = getattr(trajectories[0], "error", "") or "no reason given (see the warnings above)"
    raise PluginError(
        f"all {len(trajectories)} trajectories of the step ended in error; the first: "
        f"{first}; fix the agent loop, environment or tool it names"
    )


def rows_to_score(batch: Batch) -> list[int]:
    """The rows of a batch built from trajectories whose sample has no episode reward: only
    those need the reward manager's score (:func:`agent_scores` takes the episode reward
    for the others)."""
    wanted: list[int] = []
    start = 0
    for row, is_last in enumerate(batch["sample_last"]):
        if not is_last:
            continue
        if batch["episode_reward"][row] is None:
            wanted.extend(range(start, row + 1))
        start = row + 1
    return wanted


def agent_scores(batch: Batch, token_level_scores: torch.Tensor) -> torch.Tensor:
    """The token-level scores of a batch built from trajectories, from the reward manager's
    (``token_level_scores``): each sample's score is its episode reward when the trajectory
    set one, else the manager's score of its last sequence; every sequence of the sample gets
    it on its last sampled token (so that estimators which read the reward where the trained
    tokens end find it there), and each turn's reward is added at the turn's end."""
    import torch

    totals = token_level_scores.sum(dim=-1).tolist()
    final: list[float] = [0.0] * len(batch)
    start = 0
    for row, is_last in enumerate(batch["sample_last"]):
        if not is_last:
            continue
        episode = batch["episode_reward"][row]
        score = float(episode) if episode is not None else float(totals[row])
        for member in range(start, row + 1):
            final[member] = score
        start = row + 1
    mask = batch["response_mask"]
    width = mask.shape[-1]
    positions = torch.arange(width).expand_as(mask)
    last_sampled = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).amax(-1)
    last_sampled = last_sampled.clamp(min=0)
    scores = batch["turn_rewards"].to(torch.float32).clone()
    scores[torch.arange(len(batch)), last_sampled] += torch.tensor(final, dtype=torch.float32)
    return scores


def agent_metrics(batch: Batch) -> dict[str, float]:
    """``agent/num_turns/{mean,max}``, ``agent/<key>/mean`` of each per-sample figure of the
    trajectories' ``metrics`` (``tool_calls``, ``tool_errors``, ``tool_truncated``, what a
    loop adds), per tool ``agent/tool/<name>/{calls,errors}`` (totals over the batch) and
    ``agent/tool/<name>/latency_s`` (mean per call), and ``agent/finish/<reason>`` (the
    fraction of samples that ended so), of a batch built from trajectories."""
    last = [bool(x) for x in batch["sample_last"]]
    turns = [t for t, keep in zip(batch["num_turns"], last, strict=True) if keep]
    if not turns:
        return {}
    per_sample = [m for m, keep in zip(batch["agent_metrics"], last, strict=True) if keep]
    metrics: dict[str, float] = {
        "agent/num_turns/mean": sum(turns) / len(turns),
        "agent/num_turns/max": float(max(turns)),
        "agent/num_sequences/mean": len(batch) / len(turns),
    }
    # every other figure a loop or the session counted per sample (tool_calls, an
    # environment's step latency...) is averaged over the samples, 0 where it is missing
    plain = {key for sample in per_sample for key in sample if not key.startswith("tool/")}
    for key in sorted(plain | {"tool_calls", "tool_errors"}):
        values = [float(m.get(key, 0.0)) for m in per_sample]
        metrics[f"agent/{key}/mean"] = sum(values) / len(values)
    totals: dict[str, float] = defaultdict(float)
    for sample in per_sample:
        for key, value in sample.items():
            if key.startswith("tool/"):
                totals[key] += float(value)
    for key, value in sorted(totals.items()):
        if key.endswith("/latency_s"):
            calls = totals.get(key.removesuffix("/latency_s") + "/calls", 0.0)
            metrics[f"agent/{key}"] = value / calls if calls else 0.0
        else:
            metrics[f"agent/{key}"] = value
    reasons = [r for r, keep in zip(batch["finish_reason"], last, strict=True) if keep]
    for reason in ("stop", "length", "max_turns", *sorted(set(reasons))):
        metrics[f"agent/finish/{reason}"] = reasons.count(reason) / len(reasons)
    return metrics


def agent_rows(prompts: Batch) -> list[dict[str, Any]]:
    """Each row of a prompt batch as the mapping an agent loop reads: its columns, with
    ``prompt`` (the chat messages) and ``reward_model`` (``{"ground_truth": ...}``) as in
    verl's parquet rows. A row with images keeps its ``multi_modal_inputs`` (its prompt's
    image inputs), which a loop puts first in ``Trajectory.image_inputs``."""
    rows = []
    for index in range(len(prompts)):
        row = {name: prompts.columns[name][index] for name in prompts.columns}
        row.setdefault("prompt", row.get("raw_prompt"))
        row.setdefault("reward_model", {"ground_truth": row.get("ground_truth")})
        rows.append(row)
    return rows
