"""Truncated importance sampling (TIS) against the rollout policy.

The rollout engine samples with weights that may be older than the trainer's (fully-async
staleness) or numerically different (another engine, bf16). Weighting each token's loss by
``pi_old / pi_rollout``, truncated at ``algorithm.rollout_is_threshold``, corrects for the
difference: ``token`` weighs every token by its own ratio (biased, low variance),
``sequence`` weighs every token of a response by the product of its ratios (unbiased, high
variance).
"""

from __future__ import annotations

import math

import torch

from plugrl.errors import RecipeError

from .aggregation import masked_mean

LEVELS = ("token", "sequence")
LOG_RATIO_CLAMP = 20.0


def compute_rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights [B, R] (no gradient, zero off the mask) and their metrics.

    ``weight = min(exp(log_ratio), threshold)`` where ``log_ratio`` is
    ``old_log_probs - rollout_log_probs`` per token (``level="token"``) or its sum over the
    response (``level="sequence"``), clamped to ±20 before ``exp``.

    Metrics (verl's names): ``rollout_corr/rollout_is_mean`` (token mean of the truncated
    weights), ``..._max``, ``..._min``, ``..._ratio_fraction_high`` / ``_low`` (share of tokens,
    or responses at sequence level, whose untruncated weight is above ``threshold`` / below
    ``1 / threshold``), ``..._eff_sample_size`` (``1 / mean(w_normalised²)``).
    """
    if level not in LEVELS:
        raise RecipeError(
            f"unknown importance-sampling level {level!r}; choose token or sequence",
            key="algorithm.rollout_is",
        )
    if not threshold > 0:
        raise RecipeError(f"must be > 0, got {threshold!r}", key="algorithm.rollout_is_threshold")
    with torch.no_grad():
        mask = response_mask.to(old_log_probs.dtype)
        log_ratio = (old_log_probs - rollout_log_probs.to(old_log_probs.dtype)) * mask
        if level == "token":
            unit_log_ratio = log_ratio
            unit_mask = mask
        else:
            unit_log_ratio = log_ratio.sum(dim=-1, keepdim=True)
            unit_mask = (mask.sum(dim=-1, keepdim=True) > 0).to(mask.dtype)
        raw = torch.exp(unit_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        raw = raw.expand_as(mask) * mask
        weights = raw.clamp(max=threshold)
        metrics = _weight_metrics(weights, unit_log_ratio, unit_mask, mask, threshold)
    return weights, metrics


def _weight_metrics(
    weights: torch.Tensor,
    unit_log_ratio: torch.Tensor,
    unit_mask: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> dict[str, float]:
    prefix = "rollout_corr/rollout_is_"
    if not bool((mask != 0).any()):
        return {f"{prefix}mean": 0.0}
    valid = mask != 0
    high = (unit_log_ratio > math.log(threshold)).to(mask.dtype)
    low = (unit_log_ratio < -math.log(threshold)).to(mask.dtype)
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
