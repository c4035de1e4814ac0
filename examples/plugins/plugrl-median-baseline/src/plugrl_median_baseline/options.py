"""Options of the plugin's parts, read from the recipe: ``algorithm.adv_estimator_args`` of
``median_baseline`` and ``actor.policy_loss_args`` of ``robust_ppo``. Kept apart from the
implementations: checking a recipe and ``plugrl explain`` import only this module (no torch).
"""

from __future__ import annotations

import attrs

from plugrl.api import option, positive


@attrs.define(kw_only=True)
class MedianBaselineConfig:
    """``algorithm.adv_estimator_args`` of ``median_baseline``."""

    scale_by_mad: bool = option(
        False, "Divide by the group's median absolute deviation (plus eps) after centring."
    )
    eps: float = option(1e-6, "Added to the MAD before dividing.", validator=positive)


@attrs.define(kw_only=True)
class RobustPPOConfig:
    """``actor.policy_loss_args`` of ``robust_ppo``."""

    max_advantage: float = option(
        3.0,
        "Advantages are clipped to [-max_advantage, max_advantage] before the PPO surrogate, "
        "so that one outlier response cannot dominate a step.",
        validator=positive,
    )
    dual_clip: bool = option(
        True,
        "Bound the loss of tokens with negative advantages by actor.clip_ratio_c (dual clip), "
        "as the vanilla loss does.",
    )
