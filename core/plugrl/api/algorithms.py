"""The algorithm parts' interfaces (advantage estimators, policy losses, KL penalties) and the
formulas they share, so that a key means the same whichever plugin computes it."""

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
