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
* :func:`update_from_batch` (reference log-probs, values, advantages, critic and actor
  updates of a scored batch) and :func:`validate` (``val-core``/``val-aux`` metrics): the steps
  every scheduler shares.
* :class:`KLInReward`, :class:`DynamicSampler`, :func:`check_algorithm`,
  :func:`make_resolver` (scoring functions by data source).
"""

from importlib import import_module
from typing import Any

# where each name lives; imported on first use, so that importing one light module of the
# package (scoring, in a reward worker process) does not import torch
_HOMES = {
    "build_estimator": "build",
    "build_part": "build",
    "build_policy_loss": "build",
    "check_constructor": "build",
    "check_algorithm": "checks",
    "DynamicSampler": "dynamic_sampling",
    "filter_groups": "dynamic_sampling",
    "group_metric_values": "dynamic_sampling",
    "KLInReward": "kl_reward",
    "PolicyObjective": "objective",
    "RunParts": "run_parts",
    "build_reward_manager": "run_parts",
    "build_run_parts": "run_parts",
    "sampling_seed": "run_parts",
    "update_derives_old_log_probs": "run_parts",
    "update_from_batch": "steps",
    "validate": "steps",
    "Scorer": "scoring",
    "ScoringError": "scoring",
    "make_resolver": "scoring",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'plugrl.compose' has no attribute {name!r}")
    return getattr(import_module(f"plugrl.compose.{_HOMES[name]}"), name)


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
    "update_from_batch",
    "validate",
]
