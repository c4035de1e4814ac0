"""Token-budget micro-batch plans and the packed layout megatron's GPTModel runs on.

GPTModel applies rotary positions 0..n-1 along the sequence and a causal mask, so each row's
attended tokens are moved to the left edge (prompt then response, padding after): every
valid token then sits at its true position and never sees padding.
"""

from __future__ import annotations

import attrs
import torch


def token_budget_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Rows grouped longest first so that each micro-batch's padded size (rows x its longest
    row) stays within ``max_tokens``; a row longer than the budget travels alone."""
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    plans: list[list[int]] = []
    for row in order:
        if plans and (len(plans[-1]) + 1) * lengths[plans[-1][0]] <= max_tokens:
            plans[-1].append(row)
        else:
            plans.append([row])
    return plans


@attrs.frozen
class Packed:
    """Rows with their attended tokens at the left edge.

    ``columns [b, W]``: the original column of each packed position (padding repeats a
    column; its token is masked out by causality). ``predict [b, R']``: the packed position
    whose output predicts each response token. ``used``: ``R'``, the response columns some
    row uses.
    """

    columns: torch.Tensor
    predict: torch.Tensor
    used: int

    @property
    def width(self) -> int:
        return int(self.columns.shape[1])


def pack(attention_mask: torch.Tensor, response_width: int, multiple: int = 1) -> Packed:
    """The :class:`Packed` layout of ``[b, P + R]`` rows whose responses start at column
    ``P``; the packed width is rounded up to ``multiple`` (sequence parallelism splits it)."""
    attended = attention_mask.bool()
    prompt_width = attended.shape[1] - response_width
    counts = attended.sum(dim=1)
    width = max(int(counts.max()), 1)
    width = -(-width // multiple) * multiple
    # a stable sort of "not attended" puts attended columns first, in their order
    order = torch.argsort((~attended).to(torch.int8), dim=1, stable=True)
    if order.shape[1] < width:
        order = torch.cat([order, order[:, -1:].expand(-1, width - order.shape[1])], dim=1)
    columns = order[:, :width]
    prompt_lengths = attended[:, :prompt_width].sum(dim=1)
    used = max(int(attended[:, prompt_width:].sum(dim=1).max()), 1)
    steps = torch.arange(used, device=attention_mask.device)
    predict = ((prompt_lengths - 1)[:, None] + steps[None, :]).clamp(0, width - 1)
    return Packed(columns=columns, predict=predict, used=used)
