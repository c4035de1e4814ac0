"""plugrl plugin: the ``median_baseline`` advantage estimator and the ``robust_ppo`` policy
loss, two parts against outlier rewards.

Only names are registered here; torch is imported when a recipe chooses a part.
"""

from plugrl.api import hookimpl

_OPTIONS = "plugrl_median_baseline.options"


@hookimpl
def register_advantage_estimators(register):
    register(
        "median_baseline",
        "plugrl_median_baseline.estimator:MedianBaseline",
        config=f"{_OPTIONS}:MedianBaselineConfig",
        description="score minus the group median (optionally over the group MAD)",
    )


@hookimpl
def register_policy_losses(register):
    register(
        "robust_ppo",
        "plugrl_median_baseline.loss:RobustPPO",
        config=f"{_OPTIONS}:RobustPPOConfig",
        description="PPO clipped surrogate with advantages clipped to +-max_advantage",
    )
