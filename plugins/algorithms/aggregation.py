"""Loss aggregation over the global mini-batch (``actor.loss_agg_mode``).

A backend splits a mini-batch into micro-batches (gradient accumulation) and across
data-parallel ranks (whose gradients are averaged). Each micro-batch's aggregate is its exact
share of the whole mini-batch's value: summed over micro-batches and averaged over ranks it
equals the aggregate of the unsplit mini-batch, so the gradient does not depend on the split.
The global counts come from :class:`plugrl.parts.backend.LossScale`.
"""

from __future__ import annotations

from typing import Final

import attrs
import torch

from plugrl.errors import RecipeError
from plugrl.parts.backend import LossScale

LOSS_AGG_MODES: Final = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; values outside the mask (even NaN or inf)
    do not leak into the sum."""
    mask = mask.to(values.dtype)
    selected = torch.where(mask != 0, values, torch.zeros_like(values)) * mask
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the mask; 0 where the mask is empty."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the mask.

    With fewer than two valid elements the variance is undefined; the values are then only
    centred (a single valid value becomes 0), instead of failing.
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1)
    centred = values - mean
    if count < 2:
        return centred
    variance = masked_sum(centred.square(), mask) / (count - 1)
    return centred * torch.rsqrt(variance + 1e-8)


def loss_scale_from_mask(
    response_mask: torch.Tensor, dp_size: int = 1, max_response_length: int | None = None
) -> LossScale:
    """The :class:`LossScale` of a whole mini-batch, given all of its response mask.

    A data-parallel backend counts its own rows with :func:`count_valid` and all-reduces the
    two counts instead.
    """
    num_tokens, num_seqs = count_valid(response_mask)
    return LossScale(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        dp_size=dp_size,
        max_response_length=max_response_length,
    )


def count_valid(response_mask: torch.Tensor) -> tuple[int, int]:
    """``(valid tokens, sequences with at least one valid token)`` of a mask [B, R]."""
    mask = response_mask != 0
    return int(mask.sum()), int(mask.any(dim=-1).sum())


@attrs.frozen
class LossAggregator:
    """``aggregate(values [b, R], mask [b, R]) -> scalar``: this micro-batch's share of the
    global mini-batch aggregate in ``mode``.

    ``scale=None`` treats the given tensors as the whole mini-batch on one rank (for use
    outside a backend).
    """

    mode: str
    scale: LossScale | None = None

    def __attrs_post_init__(self) -> None:
        if self.mode not in LOSS_AGG_MODES:
            raise RecipeError(
                f"unknown loss aggregation {self.mode!r}; "
                f"choose one of {', '.join(LOSS_AGG_MODES)}",
                key="actor.loss_agg_mode",
            )

    def with_mode(self, mode: str) -> LossAggregator:
        """The same global counts, aggregated another way (losses defined per sequence use
        this to average over sequences whatever ``loss_agg_mode`` says)."""
        return LossAggregator(mode, self.scale)

    def _scale(self, mask: torch.Tensor) -> LossScale:
        if self.scale is not None:
            return self.scale
        return loss_scale_from_mask(mask)

    def __call__(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(values.dtype)
        scale = self._scale(mask)
        dp_size = scale.dp_size
        if self.mode == "token-mean":
            return masked_sum(values, mask) * (dp_size / max(scale.num_tokens, 1))
        if self.mode == "token-sum":
            return masked_sum(values, mask) * dp_size
        per_sequence = masked_sum(values, mask, dim=-1)
        if self.mode == "seq-mean-token-mean":
            lengths = mask.sum(dim=-1)
            # an empty sequence has a zero sum; dividing by 1 keeps it zero
            per_sequence = per_sequence / lengths.clamp(min=1)
        total = per_sequence.sum() * (dp_size / max(scale.num_seqs, 1))
        if self.mode == "seq-mean-token-sum-norm":
            # A constant horizon keeps the normaliser the same for every micro-batch; the mask
            # width is the fallback when the backend does not say the maximum length.
            horizon = scale.max_response_length or mask.shape[-1]
            total = total / horizon
        return total

    def token_share(self, mask: torch.Tensor) -> float:
        """The fraction of the global valid tokens that this micro-batch holds, times
        ``dp_size``: weights a token-mean metric of the micro-batch into its share."""
        scale = self._scale(mask)
        local = int((mask != 0).sum())
        return local * scale.dp_size / max(scale.num_tokens, 1)
