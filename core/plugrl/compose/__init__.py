"""Composing a run: the services any scheduler uses, built in or third-party, without
importing another plugin.

* :func:`build_part`: a registered part, built as ``cls(config, context)`` after checking it
  fits its interface; :func:`build_estimator`, :func:`build_policy_loss`,
  :func:`build_reward_manager` for the algorithm and reward parts.
* :func:`build_run_parts` (also :meth:`plugrl.run.RunContext.build_parts`): everything a recipe
  chose, checked up front, as :class:`RunParts` (data, reward, estimator, objective, KL in
  reward, trainer worker groups, engine group, weight transport, checkpoints).
* :class:`PolicyObjective`: the actor loss (policy loss + KL loss - entropy bonus, with
  importance weights) that training backends call per micro-batch.
* :class:`KLInReward`, :class:`DynamicSampler`, :func:`check_algorithm`,
  :func:`make_resolver` (scoring functions by data source).
"""

from plugrl.compose.build import build_estimator, build_part, build_policy_loss, check_constructor
from plugrl.compose.checks import check_algorithm
from plugrl.compose.dynamic_sampling import DynamicSampler, filter_groups, group_metric_values
from plugrl.compose.kl_reward import KLInReward
from plugrl.compose.objective import PolicyObjective
from plugrl.compose.run_parts import (
    RunParts,
    build_reward_manager,
    build_run_parts,
    sampling_seed,
    update_derives_old_log_probs,
)
from plugrl.compose.scoring import Scorer, ScoringError, make_resolver

__all__ = [
    "DynamicSampler",
    "KLInReward",
    "PolicyObjective",
    "RunParts",
    "Scorer",
    "ScoringError",
    "build_estimator",
    "build_part",
    "build_policy_loss",
    "build_reward_manager",
    "build_run_parts",
    "check_algorithm",
    "check_constructor",
    "filter_groups",
    "group_metric_values",
    "make_resolver",
    "sampling_seed",
    "update_derives_old_log_probs",
]
