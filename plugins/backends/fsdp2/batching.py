"""Cutting a rank's rows into micro-batches, and cutting the padding out of a micro-batch.

The backend runs padded micro-batches, so what a micro-batch costs (time and activation memory)
is its row count times its longest row once the columns that are padding in every row are cut.
Token-budget batching sorts rows by length so that rows of similar length share a micro-batch,
which keeps that padded cost close to the real token count.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from plugrl.errors import RecipeError


def fixed_micro_batches(num_rows: int, size: int | None) -> list[list[int]]:
    """Consecutive micro-batches of ``size`` rows (the last may be smaller); ``None``: one."""
    if num_rows == 0:
        return []
    size = num_rows if size is None else size
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


def _consecutive_groups(sorted_lengths: Sequence[int], cap: int) -> list[range]:
    """Greedy consecutive groups of rows sorted longest first, each costing at most ``cap``
    (rows x first row's length); the fewest such groups for that cap."""
    groups = []
    start = 0
    while start < len(sorted_lengths):
        rows = max(1, cap // max(sorted_lengths[start], 1))
        end = min(start + rows, len(sorted_lengths))
        groups.append(range(start, end))
        start = end
    return groups


def token_budget_micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    min_micro_batches: int = 1,
    *,
    key: str = "actor.ppo_max_token_len_per_gpu",
) -> list[list[int]]:
    """Row indices of micro-batches whose padded cost stays within ``max_tokens``.

    Rows are sorted longest first and cut into consecutive groups; among the groupings with the
    fewest micro-batches (at least ``min_micro_batches``, which ranks use to agree on a count),
    the one whose most expensive micro-batch is cheapest is chosen, so micro-batches come out
    balanced. A row longer than the budget is a :class:`RecipeError` naming ``key``.
    """
    num_rows = len(lengths)
    if num_rows == 0:
        return []
    if min_micro_batches > num_rows:
        raise ValueError(f"cannot cut {num_rows} rows into {min_micro_batches} micro-batches")
    order = sorted(range(num_rows), key=lambda i: (-lengths[i], i))
    sorted_lengths = [int(lengths[i]) for i in order]
    longest = sorted_lengths[0]
    if longest > max_tokens:
        raise RecipeError(
            f"a sequence of {longest} tokens does not fit the micro-batch token budget of "
            f"{max_tokens}; set it to at least the prompt plus response length ({longest})",
            key=key,
        )
    count = max(len(_consecutive_groups(sorted_lengths, max_tokens)), min_micro_batches)
    # the smallest cap that still needs no more than `count` groups
    low, high = longest, max_tokens
    while low < high:
        middle = (low + high) // 2
        if len(_consecutive_groups(sorted_lengths, middle)) <= count:
            high = middle
        else:
            low = middle + 1
    groups = [list(group) for group in _consecutive_groups(sorted_lengths, low)]
    while len(groups) < count:
        # ranks agreed on more micro-batches than this rank needs: halve the costliest
        splittable = [g for g in groups if len(g) > 1]
        costliest = max(splittable, key=lambda g: len(g) * sorted_lengths[g[0]])
        where = groups.index(costliest)
        half = len(costliest) // 2
        groups[where : where + 1] = [costliest[:half], costliest[half:]]
    return [[order[i] for i in group] for group in groups]


@attrs.frozen
class Trim:
    """The columns of a micro-batch worth computing.

    ``start:end`` of the full ``[P + R]`` sequence axis; the first ``response_len`` response
    positions lie inside it, the rest are padding in every row.
    """

    start: int
    end: int
    response_len: int


def padding_trim(attention_mask: torch.Tensor, response_width: int) -> Trim:
    """Where to cut ``[b, P + R]`` tensors so that only columns some row attends to remain.

    Keeps at least the last prompt position (its logits predict the first response token) and
    one response position, so the shapes downstream are never empty.
    """
    total = attention_mask.shape[-1]
    prompt_width = total - response_width
    used = attention_mask.bool().any(dim=0).nonzero()
    if len(used) == 0:
        first, last = prompt_width - 1, prompt_width
    else:
        first, last = int(used[0]), int(used[-1])
    start = max(min(first, prompt_width - 1), 0)
    end = min(max(last + 1, prompt_width + 1), total)
    return Trim(start=start, end=end, response_len=end - prompt_width)


def valid_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Attended tokens per row."""
    return attention_mask.sum(dim=-1).tolist()
