"""plugrl plugin: the ``median_baseline`` advantage estimator.

Only names are registered here; torch is imported when a recipe chooses the estimator.
"""

import attrs

import plugrl


@attrs.define(kw_only=True)
class MedianBaselineConfig:
    """``algorithm.adv_estimator_args`` of ``median_baseline``."""

    scale_by_mad: bool = False
    eps: float = 1e-6


@plugrl.hookimpl
def register_advantage_estimators(register):
    register(
        "median_baseline",
        "plugrl_median_baseline.estimator:MedianBaseline",
        config=MedianBaselineConfig,
        description="score minus the group median (optionally over the group MAD)",
    )
