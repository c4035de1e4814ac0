"""Config classes of the estimators that take options, read from
``algorithm.adv_estimator_args``.

Kept apart from the implementations so that validating a recipe or ``plugrl explain`` does not
import torch.
"""

from __future__ import annotations

import attrs

from plugrl.api import option


@attrs.define(kw_only=True)
class GAEArgs:
    """``algorithm.adv_estimator_args`` of ``gae``."""

    whiten: bool = option(
        True,
        "Whiten the advantages over the batch's response tokens (zero mean, unit variance).",
    )


@attrs.define(kw_only=True)
class GDPOArgs:
    """``algorithm.adv_estimator_args`` of ``gdpo``: the reward components it normalises one by
    one."""

    gdpo_reward_keys: list[str] = option(
        factory=list,
        help="Per-response reward fields to normalise within each group separately (the "
        "reward function returns them in its result, e.g. [accuracy_reward, format_reward]); "
        "at least one.",
        verl="algorithm.gdpo_reward_keys",
    )
    gdpo_reward_weights: list[float] | None = option(
        None,
        "Weight of each normalised component in the sum, one per key; unset: 1 each.",
        verl="algorithm.gdpo_reward_weights",
    )


@attrs.define(kw_only=True)
class OptimalTokenBaselineArgs:
    """``algorithm.adv_estimator_args`` of ``optimal_token_baseline`` and
    ``tir_optimal_token_baseline``."""

    handle_zero_tail: bool = option(
        True,
        "Give baseline 0 to the tokens of a group's longest response past the second longest "
        "(where it would be its own baseline and its advantage always 0).",
    )
