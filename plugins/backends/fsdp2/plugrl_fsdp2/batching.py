"""Cutting a rank's rows into micro-batches, and cutting the padding out of a micro-batch.

Packed (``actor.use_remove_padding``) a micro-batch costs its real token count:
token-budget batching fills micro-batches up to the budget with rows of any length
(:func:`packed_micro_batches`). Padded, every row is moved to the left edge and a micro-batch
costs its row count times its longest row: token-budget batching then sorts rows by length so
that rows of similar length share a micro-batch (:func:`token_budget_micro_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

from plugrl.api import RecipeError


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


def _cheapest_consecutive_groups(
    sorted_lengths: Sequence[int], count: int, max_tokens: int
) -> list[range] | None:
    """The split of length-sorted rows into exactly ``count`` consecutive groups, each within
    ``max_tokens``, that computes the fewest padded tokens (dynamic programming over group
    ends); ``None`` when there are too many rows to afford the quadratic table."""
    rows = len(sorted_lengths)
    if rows > _MAX_ROWS_FOR_EXACT_SPLIT:
        return None
    lengths = np.asarray(sorted_lengths, dtype=np.float64)
    ends = np.arange(1, rows + 1)[:, None]
    starts = np.arange(rows)[None, :]
    # cost[e - 1, s]: rows s..e-1 in one micro-batch, padded to row s (the longest)
    cost = (ends - starts) * lengths[None, :]
    cost[(starts >= ends) | (cost > max_tokens)] = np.inf
    best = np.full(rows + 1, np.inf)
    best[0] = 0.0
    choices = []
    for _ in range(count):
        candidates = best[None, :-1] + cost
        choice = candidates.argmin(axis=1)
        best = np.concatenate([[np.inf], candidates[np.arange(rows), choice]])
        choices.append(choice)
    if not np.isfinite(best[rows]):
        return None
    groups = []
    end = rows
    for choice in reversed(choices):
        start = int(choice[end - 1])
        groups.append(range(start, end))
        end = start
    return groups[::-1]


# Beyond this many rows on one rank the exact split's table (rows^2 floats) gets too big.
_MAX_ROWS_FOR_EXACT_SPLIT = 2048


def token_budget_micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    min_micro_batches: int = 1,
    *,
    key: str = "actor.ppo_max_token_len_per_gpu",
    ranks: int = 1,
) -> list[list[int]]:
    """Row indices of micro-batches whose padded cost stays within ``max_tokens``.

    Rows are sorted longest first and cut into consecutive groups: as few as the budget allows
    (at least ``min_micro_batches``, which ranks use to agree on a count), and among those
    splits the one that computes the fewest padded tokens. A row longer than the budget is a
    :class:`RecipeError` naming ``key`` (whose value is ``max_tokens`` over ``ranks``, the
    ranks a sequence is split over).
    """
    if not len(lengths):
        return []
    order = _longest_first(lengths, max_tokens, min_micro_batches, key, ranks)
    sorted_lengths = [int(lengths[i]) for i in order]
    count = max(len(_consecutive_groups(sorted_lengths, max_tokens)), min_micro_batches)
    groups = _cheapest_consecutive_groups(sorted_lengths, count, max_tokens)
    if groups is None:
        groups = _balanced_consecutive_groups(sorted_lengths, count, max_tokens)
    return [[order[i] for i in group] for group in groups]


def _longest_first(
    lengths: Sequence[int], max_tokens: int, min_micro_batches: int, key: str, ranks: int
) -> list[int]:
    """Row indices longest first (ties by index), once the rows can make ``min_micro_batches``
    micro-batches and the longest fits ``max_tokens`` (else a :class:`RecipeError` naming
    ``key``, whose value is ``max_tokens`` over ``ranks``)."""
    num_rows = len(lengths)
    if min_micro_batches > num_rows:
        raise ValueError(f"cannot cut {num_rows} rows into {min_micro_batches} micro-batches")
    order = sorted(range(num_rows), key=lambda i: (-lengths[i], i))
    longest = int(lengths[order[0]])
    if longest > max_tokens:
        budget = f"{max_tokens}"
        needed = f"the prompt plus response length ({longest})"
        if ranks > 1:
            budget += f" ({max_tokens // ranks} on each of the {ranks} ranks it is split over)"
            needed = f"{-(-longest // ranks)}, a rank's share of the sequence"
        raise RecipeError(
            f"a sequence of {longest} tokens does not fit the micro-batch token budget of "
            f"{budget}; set it to at least {needed}",
            key=key,
        )
    return order


def _balanced_consecutive_groups(
    sorted_lengths: Sequence[int], count: int, max_tokens: int
) -> list[range]:
    """``count`` consecutive groups whose costliest is as cheap as possible (for rank shares
    too large for the exact split)."""
    low, high = sorted_lengths[0], max_tokens
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
    return [range(g[0], g[-1] + 1) for g in groups]


def packed_micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    min_micro_batches: int = 1,
    *,
    key: str = "actor.ppo_max_token_len_per_gpu",
    ranks: int = 1,
) -> list[list[int]]:
    """Row indices of micro-batches whose real token count stays within ``max_tokens``, for
    packed forwards, where a micro-batch costs the sum of its rows' lengths.

    As few micro-batches as the budget allows (at least ``min_micro_batches``, which ranks use
    to agree on a count), their token counts as even as possible: rows go longest first to the
    micro-batch holding the fewest tokens. A row longer than the budget is a
    :class:`RecipeError` naming ``key`` (whose value is ``max_tokens`` over ``ranks``).
    """
    if not len(lengths):
        return []
    order = _longest_first(lengths, max_tokens, min_micro_batches, key, ranks)
    total = sum(int(length) for length in lengths)
    count = max(min_micro_batches, -(-total // max_tokens))
    while True:
        groups = _least_loaded_first(lengths, order, count, max_tokens)
        if groups is not None:
            return [sorted(group) for group in groups]
        count += 1


def _least_loaded_first(
    lengths: Sequence[int], order: Sequence[int], count: int, max_tokens: int
) -> list[list[int]] | None:
    """Rows in ``order`` each put into the one of ``count`` micro-batches holding the fewest
    tokens; None when a row does not fit there (then none fits anywhere)."""
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for row in order:
        target = min(range(count), key=loads.__getitem__)
        if loads[target] + int(lengths[row]) > max_tokens:
            return None
        groups[target].append(row)
        loads[target] += int(lengths[row])
    return groups


@attrs.frozen
class Alignment:
    """How to lay a micro-batch out without shared padding, and where its response logits are.

    Each row is shifted left so that its first attended token lands in column 0: a row then
    costs its own length, not the micro-batch's longest prompt plus its longest response.

    * ``columns`` [b, W]: for each new column, the original column it takes.
    * ``attention_mask`` [b, W]: the mask in the new layout (right padding only).
    * ``keep``: how many trailing positions' outputs are needed (``logits_to_keep``).
    * ``response_index`` [b, R']: for each response token, the index among those trailing
      positions of the output that predicts it; ``R'`` is the longest response in use.
    """

    columns: torch.Tensor
    attention_mask: torch.Tensor
    keep: int
    response_index: torch.Tensor

    @property
    def response_len(self) -> int:
        return int(self.response_index.shape[-1])


def left_align(attention_mask: torch.Tensor, response_width: int) -> Alignment:
    """The :class:`Alignment` of ``[b, P + R]`` rows whose responses start at column ``P``.

    Keeps, in every row, the last prompt position (its output predicts the first response
    token) and at least one response position, so no shape is ever empty.
    """
    total = attention_mask.shape[1]
    prompt_width = total - response_width
    device = attention_mask.device
    attended = attention_mask.bool()
    has_tokens = attended.any(dim=1)
    first = torch.where(has_tokens, attended.int().argmax(dim=1), prompt_width - 1)
    first = first.clamp(max=prompt_width - 1)
    last = torch.where(
        has_tokens, total - 1 - attended.flip(1).int().argmax(dim=1), prompt_width
    ).clamp(min=prompt_width)
    width = int((last - first + 1).max())
    offsets = torch.arange(width, device=device)
    columns = first[:, None] + offsets[None, :]
    inside = columns <= last[:, None]
    columns = columns.clamp(max=total - 1)
    aligned_mask = attention_mask.gather(1, columns) * inside
    # new column of each row's first response token
    starts = prompt_width - first
    earliest = int(starts.min())
    keep = width - earliest + 1
    response_len = int((last - prompt_width + 1).max())
    steps = torch.arange(response_len, device=device)
    response_index = ((starts - earliest)[:, None] + steps[None, :]).clamp(max=keep - 1)
    return Alignment(columns, aligned_mask, keep, response_index)


def valid_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Attended tokens per row."""
    return attention_mask.sum(dim=-1).tolist()
