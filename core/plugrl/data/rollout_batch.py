"""Assemble the training batch from a prompt batch and the completions a rollout engine sampled.

Rows follow verl's layout: each prompt row is repeated ``n`` times, interleaved (the n responses
of prompt 0, then those of prompt 1...), so rows sharing a ``uid`` form a GRPO group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plugrl.data.batch import Batch
    from plugrl.parts.rollout import Completion


def fit_response_width(lengths: Iterable[int], response_width: int | None) -> int:
    """The response width a batch of responses of ``lengths`` tokens gets: ``response_width``
    when given (no response may be longer: ``ValueError``), else the longest (at least 1, so
    tensors are never empty)."""
    longest = max(lengths, default=0)
    if response_width is None:
        return max(1, longest)
    if longest > response_width:
        raise ValueError(
            f"a response has {longest} tokens, more than the response width {response_width}"
        )
    return response_width


def build_rollout_batch(
    prompts: Batch,
    completions: Sequence[Completion],
    *,
    n: int,
    pad_token_id: int,
    response_width: int | None = None,
) -> Batch:
    """The prompt batch's rows repeated ``n`` times with the sampled responses added.

    ``completions`` are those :meth:`RolloutEngine.generate` returned for the batch's
    ``raw_prompt_ids``: ``len(prompts) * n`` of them, grouped by prompt. Tensors added:
    ``responses`` [B*n, R] right-padded with ``pad_token_id``, ``response_mask`` [B*n, R],
    ``input_ids``/``attention_mask``/``position_ids`` [B*n, P+R] (positions count real tokens
    only, so left padding does not shift them), ``rollout_log_probs`` [B*n, R] (0 on padding).
    Columns added: ``finish_reason``, ``weight_version``, ``min_weight_version``.
    ``R`` is ``response_width`` when given (no response may be longer), else the longest
    response (at least 1, so tensors are never empty). ``meta`` records the layout
    (``prompt_width`` P, ``response_width`` R, ``pad_token_id``), by which
    :meth:`Batch.concat` joins batches of different widths.
    """
    import torch

    prompts.require("prompts", "prompt_attention_mask", by="build_rollout_batch")
    num_prompts = len(prompts)
    if len(completions) != num_prompts * n:
        raise ValueError(
            f"expected {num_prompts} prompts x n={n} = {num_prompts * n} completions, "
            f"got {len(completions)}"
        )
    for position, completion in enumerate(completions):
        if completion.prompt_index != position // n:
            raise ValueError(
                f"completion {position} belongs to prompt {completion.prompt_index}, expected "
                f"{position // n}: completions must be grouped by prompt in prompt order"
            )
        if len(completion.log_probs) != len(completion.token_ids):
            raise ValueError(
                f"completion {position} has {len(completion.token_ids)} tokens but "
                f"{len(completion.log_probs)} log-probs"
            )
    response_width = fit_response_width((len(c.token_ids) for c in completions), response_width)

    rows = len(completions)
    responses = torch.full((rows, response_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, response_width), dtype=torch.long)
    rollout_log_probs = torch.zeros((rows, response_width), dtype=torch.float32)
    for row, completion in enumerate(completions):
        length = len(completion.token_ids)
        if length:
            responses[row, :length] = torch.tensor(completion.token_ids, dtype=torch.long)
            response_mask[row, :length] = 1
            rollout_log_probs[row, :length] = torch.tensor(
                completion.log_probs, dtype=torch.float32
            )

    batch = prompts.repeat(n, interleave=True)
    prompt_ids = batch["prompts"]
    attention_mask = torch.cat(
        [batch["prompt_attention_mask"], response_mask.to(prompt_ids.device)], dim=-1
    )
    batch["responses"] = responses.to(prompt_ids.device)
    batch["response_mask"] = response_mask.to(prompt_ids.device)
    batch["input_ids"] = torch.cat([prompt_ids, batch["responses"]], dim=-1)
    batch["attention_mask"] = attention_mask
    batch["position_ids"] = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    batch["rollout_log_probs"] = rollout_log_probs.to(prompt_ids.device)
    batch["finish_reason"] = [c.finish_reason for c in completions]
    batch["weight_version"] = [c.weight_version for c in completions]
    batch["min_weight_version"] = [c.min_weight_version for c in completions]
    batch.meta.update(
        prompt_width=int(prompt_ids.shape[-1]),
        response_width=response_width,
        pad_token_id=pad_token_id,
    )
    return batch
