"""The algorithm parts' interfaces (advantage estimators, policy losses, KL penalties) and the
formulas they share, so that a key means the same whichever plugin computes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.algorithms.functional import (
        LOG_RATIO_CLAMP,
        LossAggregator,
        compute_rollout_is_weights,
        count_valid,
        loss_scale_from_mask,
        masked_mean,
        masked_sum,
        masked_whiten,
        sum_norm_divisor,
    )
    from plugrl.parts.algorithm import (
        ActorObjective,
        AdvantageEstimator,
        Aggregate,
        AlgorithmConfig,
        KLPenalty,
        LossScale,
        PolicyLoss,
        PolicyLossConfig,
    )

__all__ = [
    "LOG_RATIO_CLAMP",
    "ActorObjective",
    "AdvantageEstimator",
    "Aggregate",
    "AlgorithmConfig",
    "KLPenalty",
    "LossAggregator",
    "LossScale",
    "PolicyLoss",
    "PolicyLossConfig",
    "compute_rollout_is_weights",
    "count_valid",
    "loss_scale_from_mask",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "sum_norm_divisor",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "LOG_RATIO_CLAMP": ("plugrl.algorithms.functional", "LOG_RATIO_CLAMP"),
        "ActorObjective": ("plugrl.parts.algorithm", "ActorObjective"),
        "AdvantageEstimator": ("plugrl.parts.algorithm", "AdvantageEstimator"),
        "Aggregate": ("plugrl.parts.algorithm", "Aggregate"),
        "AlgorithmConfig": ("plugrl.parts.algorithm", "AlgorithmConfig"),
        "KLPenalty": ("plugrl.parts.algorithm", "KLPenalty"),
        "LossAggregator": ("plugrl.algorithms.functional", "LossAggregator"),
        "LossScale": ("plugrl.parts.algorithm", "LossScale"),
        "PolicyLoss": ("plugrl.parts.algorithm", "PolicyLoss"),
        "PolicyLossConfig": ("plugrl.parts.algorithm", "PolicyLossConfig"),
        "compute_rollout_is_weights": (
            "plugrl.algorithms.functional",
            "compute_rollout_is_weights",
        ),
        "count_valid": ("plugrl.algorithms.functional", "count_valid"),
        "loss_scale_from_mask": ("plugrl.algorithms.functional", "loss_scale_from_mask"),
        "masked_mean": ("plugrl.algorithms.functional", "masked_mean"),
        "masked_sum": ("plugrl.algorithms.functional", "masked_sum"),
        "masked_whiten": ("plugrl.algorithms.functional", "masked_whiten"),
        "sum_norm_divisor": ("plugrl.algorithms.functional", "sum_norm_divisor"),
    },
)
