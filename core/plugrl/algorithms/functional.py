"""Tensor functions that parts share: masked reductions, loss aggregation over the global
mini-batch (``actor.loss_agg_mode``), and truncated importance weights against the rollout
policy.

Loss aggregation: a backend splits a mini-batch into micro-batches (gradient accumulation)
and across data-parallel ranks (whose gradients are averaged). Each micro-batch's aggregate is
its exact share of the whole mini-batch's value: summed over micro-batches and averaged over
ranks it equals the aggregate of the unsplit mini-batch, so the gradient does not depend on the
split. The global counts come from :class:`plugrl.parts.algorithm.LossScale`.
"""

from __future__ import annotations

import math
from typing import Final

import attrs
import torch

from plugrl.errors import RecipeError
from plugrl.parts.algorithm import LossScale, parse_rollout_is_threshold

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
    response_mask: torch.Tensor,
    dp_size: int = 1,
    max_response_length: int | None = None,
    loss_scale_factor: int | None = None,
) -> LossScale:
    """The :class:`LossScale` of a whole mini-batch, given all of its response mask.

    A data-parallel backend counts its own rows and all-reduces the two counts instead
    (:func:`plugrl.algorithms.training.all_reduced_loss_scale`). Give ``max_response_length``
    (``data.max_response_length``) and ``loss_scale_factor`` (``actor.loss_scale_factor``)
    from the recipe: see :func:`sum_norm_divisor`.
    """
    num_tokens, num_seqs = count_valid(response_mask)
    return LossScale(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        dp_size=dp_size,
        max_response_length=max_response_length,
        loss_scale_factor=loss_scale_factor,
    )


def sum_norm_divisor(scale: LossScale, mask_width: int) -> float:
    """What ``seq-mean-token-sum-norm`` divides the sequence mean by: the scale's
    ``loss_scale_factor`` when set, else its ``max_response_length``, else ``mask_width``.

    The first two are constants of the run, so every step and micro-batch is normalised
    alike (Dr.GRPO's point); the mask width, verl's default in ``agg_loss``, is the fallback
    for a scale that gives neither. In verl, responses are padded to
    ``data.max_response_length``, so its default is that constant too.
    """
    if scale.loss_scale_factor is not None:
        return scale.loss_scale_factor
    return scale.max_response_length or mask_width


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
            total = total / sum_norm_divisor(scale, mask.shape[-1])
        return total

    def token_share(self, mask: torch.Tensor) -> float:
        """The fraction of the global valid tokens that this micro-batch holds, times
        ``dp_size``: weights a token-mean metric of the micro-batch into its share."""
        scale = self._scale(mask)
        local = int((mask != 0).sum())
        return local * scale.dp_size / max(scale.num_tokens, 1)


# --------------------------------------------------------------------------------------------
# Truncated importance sampling (TIS) against the rollout policy, and token masks (IcePop, KPop)
# --------------------------------------------------------------------------------------------
# The rollout engine samples with weights that may be older than the trainer's (fully-async
# staleness) or numerically different (another engine, bf16). Weighting each token's loss by
# ``pi_old / pi_rollout``, truncated at ``algorithm.rollout_is_threshold``, corrects for the
# difference: ``token`` weighs every token by its own ratio (biased, low variance),
# ``sequence`` weighs every token of a response by the product of its ratios (unbiased, high
# variance).
#
# Truncation keeps a token whose ratio is extreme, at the bound; masking drops it. IcePop (a
# ``"lower_upper"`` threshold, verl's spelling) gives weight 0 to a ratio outside
# ``[lower, upper]``; KPop (``algorithm.kpop_threshold``) gives weight 0 to a token whose
# two-outcome KL between the two policies (this token, or any other) exceeds the threshold in
# either direction, a band that is wide in ratio for rare tokens and narrow for confident ones.

LEVELS = ("token", "sequence")
LOG_RATIO_CLAMP = 20.0
KPOP_PROB_CLAMP = 1e-6
"""KPop's probabilities are kept within ``[1e-6, 1 - 1e-6]`` so that the complement's
logarithm stays finite for a token of probability 1."""


def binary_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL between two two-outcome distributions, ``(p, 1 - p)`` and ``(q, 1 - q)``."""
    return p * (p.log() - q.log()) + (1 - p) * ((1 - p).log() - (1 - q).log())


def kpop_keep(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, threshold: float
) -> torch.Tensor:
    """KPop's tokens to keep (bool [B, R]): the binary KL between the trainer's and the
    engine's probability of the sampled token is at most ``threshold`` both ways round."""
    low, high = KPOP_PROB_CLAMP, 1 - KPOP_PROB_CLAMP
    trainer = old_log_probs.double().exp().clamp(low, high)
    engine = rollout_log_probs.double().exp().clamp(low, high)
    return (binary_kl(trainer, engine) <= threshold) & (binary_kl(engine, trainer) <= threshold)


def compute_rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: float | str,
    kpop_threshold: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights [B, R] (no gradient, zero off the mask) and their metrics.

    ``weight = min(exp(log_ratio), threshold)`` where ``log_ratio`` is
    ``old_log_probs - rollout_log_probs`` per token (``level="token"``) or its sum over the
    response (``level="sequence"``), clamped to ±20 before ``exp``. A ``"lower_upper"``
    threshold (IcePop) gives weight 0 where the untruncated weight is outside
    ``[lower, upper]`` and keeps it as it is inside. ``kpop_threshold`` (KPop) then gives
    weight 0 to each token :func:`kpop_keep` drops.

    Metrics (verl's names): ``rollout_corr/rollout_is_mean`` (token mean of the applied
    weights), ``..._max``, ``..._min``, ``..._ratio_fraction_high`` / ``_low`` (share of tokens,
    or responses at sequence level, whose untruncated weight is above the upper bound / below
    the lower bound, ``1 / upper`` when there is none), ``..._eff_sample_size``
    (``1 / mean(w_normalised²)``); with IcePop ``..._oob_ratio`` (share of tokens given 0), with
    KPop ``rollout_corr/kpop_masked_fraction``.
    """
    if level not in LEVELS:
        raise RecipeError(
            f"unknown importance-sampling level {level!r}; choose token or sequence",
            key="algorithm.rollout_is",
        )
    try:
        upper, lower = parse_rollout_is_threshold(threshold)
    except ValueError as exc:
        raise RecipeError(str(exc), key="algorithm.rollout_is_threshold") from None
    if kpop_threshold is not None and not kpop_threshold > 0:
        raise RecipeError(f"must be > 0, got {kpop_threshold!r}", key="algorithm.kpop_threshold")
    with torch.no_grad():
        mask = response_mask.to(old_log_probs.dtype)
        rollout = rollout_log_probs.to(old_log_probs.dtype)
        log_ratio = (old_log_probs - rollout) * mask
        if level == "token":
            unit_log_ratio = log_ratio
            unit_mask = mask
        else:
            unit_log_ratio = log_ratio.sum(dim=-1, keepdim=True)
            unit_mask = (mask.sum(dim=-1, keepdim=True) > 0).to(mask.dtype)
        raw = torch.exp(unit_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        raw = raw.expand_as(mask) * mask
        if lower is None:
            weights = raw.clamp(max=upper)
        else:
            inside = (raw >= lower) & (raw <= upper)
            weights = torch.where(inside, raw, torch.zeros_like(raw))
        metrics = _weight_metrics(weights, unit_log_ratio, unit_mask, mask, upper, lower)
        if lower is not None and bool((mask != 0).any()):
            outside = ((raw < lower) | (raw > upper)).to(mask.dtype)
            metrics["rollout_corr/rollout_is_oob_ratio"] = float(masked_mean(outside, mask))
        if kpop_threshold is not None:
            keep = kpop_keep(old_log_probs, rollout, kpop_threshold)
            weights = weights * keep.to(weights.dtype)
            dropped = (~keep).to(mask.dtype)
            metrics["rollout_corr/kpop_masked_fraction"] = float(masked_mean(dropped, mask))
            metrics["rollout_corr/rollout_is_mean"] = float(masked_mean(weights, mask))
    return weights, metrics


def _weight_metrics(
    weights: torch.Tensor,
    unit_log_ratio: torch.Tensor,
    unit_mask: torch.Tensor,
    mask: torch.Tensor,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    prefix = "rollout_corr/rollout_is_"
    if not bool((mask != 0).any()):
        return {f"{prefix}mean": 0.0}
    valid = mask != 0
    lower = 1 / upper if lower is None else lower
    high = (unit_log_ratio > math.log(upper)).to(mask.dtype)
    low = (unit_log_ratio < math.log(lower)).to(mask.dtype)
    mean = masked_mean(weights, mask)
    normalised = weights / (mean + 1e-8)
    return {
        f"{prefix}mean": float(mean),
        f"{prefix}max": float(weights[valid].max()),
        f"{prefix}min": float(weights[valid].min()),
        f"{prefix}ratio_fraction_high": float(masked_mean(high, unit_mask)),
        f"{prefix}ratio_fraction_low": float(masked_mean(low, unit_mask)),
        f"{prefix}eff_sample_size": float(1.0 / masked_mean(normalised.square(), mask)),
    }
