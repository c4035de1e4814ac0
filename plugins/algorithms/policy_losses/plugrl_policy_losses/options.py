"""Config classes of the losses that take options, read from ``actor.policy_loss_args``.

Kept apart from the implementations so that validating a recipe or ``plugrl explain`` does not
import torch.
"""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, option, positive


def _above_lower_bound(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value <= instance.clip_cov_lb:
        raise ConfigValueError(
            attribute.name,
            f"must be greater than clip_cov_lb ({instance.clip_cov_lb}), got {value!r}",
        )


@attrs.define(kw_only=True)
class ClipCovArgs:
    """``actor.policy_loss_args`` of ``clip_cov``."""

    clip_cov_ratio: float = option(
        0.0002,
        "Fraction of the micro-batch's response tokens whose gradient is cut.",
        verl="actor_rollout_ref.actor.policy_loss.clip_cov_ratio",
        validator=positive,
    )
    clip_cov_lb: float = option(
        1.0,
        "Tokens are candidates when their advantage-logprob covariance is above this.",
        verl="actor_rollout_ref.actor.policy_loss.clip_cov_lb",
    )
    clip_cov_ub: float = option(
        5.0,
        "... and below this.",
        verl="actor_rollout_ref.actor.policy_loss.clip_cov_ub",
        validator=_above_lower_bound,
    )


@attrs.define(kw_only=True)
class KLCovArgs:
    """``actor.policy_loss_args`` of ``kl_cov``."""

    kl_cov_ratio: float = option(
        0.0002,
        "Fraction of the micro-batch's response tokens (highest covariance) given a KL penalty.",
        verl="actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
        validator=positive,
    )
    ppo_kl_coef: float = option(
        0.1,
        "Coefficient of the |log-ratio| penalty on those tokens.",
        verl="actor_rollout_ref.actor.policy_loss.ppo_kl_coef",
        validator=positive,
    )


@attrs.define(kw_only=True)
class SapoArgs:
    """``actor.policy_loss_args`` of ``sapo``: the temperatures of its soft gate."""

    tau_pos: float = option(
        1.0,
        "Gate temperature of tokens with a positive advantage (higher: sharper, closer to a "
        "hard clip).",
        verl="actor_rollout_ref.actor.tau_pos",
        validator=positive,
    )
    tau_neg: float = option(
        1.05,
        "Gate temperature of tokens with a zero or negative advantage (above tau_pos: "
        "negative updates fade faster, as the method recommends).",
        verl="actor_rollout_ref.actor.tau_neg",
        validator=positive,
    )
