"""Algorithm pieces: advantage estimators, policy losses, KL penalties, and the objective they
make together."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs

from plugrl.config import non_negative, option, positive, section

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.parts.backend import ActorConfig, LossScale

Aggregate = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``aggregate(values [b, R], mask [b, R]) -> scalar``: reduces per-token values the way
``actor.loss_agg_mode`` says, as this micro-batch's share of the global mini-batch."""

KLPenalty = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``kl(log_prob, ref_log_prob) -> per-token penalty`` of the same shape."""


@attrs.define(kw_only=True)
class KLControlConfig:
    """``algorithm.kl_ctrl``: the coefficient of KL-in-reward."""

    type: str = option(
        "fixed",
        "Fixed coefficient, or adaptive (targets target_kl).",
        choices=["fixed", "adaptive"],
        verl="algorithm.kl_ctrl.type",
    )
    kl_coef: float = option(
        0.001, "(Initial) coefficient.", verl="algorithm.kl_ctrl.kl_coef", validator=non_negative
    )
    horizon: int = option(
        10000, "Adaptive controller horizon.", verl="algorithm.kl_ctrl.horizon", validator=positive
    )
    target_kl: float = option(
        0.1,
        "Adaptive controller target KL.",
        verl="algorithm.kl_ctrl.target_kl",
        validator=non_negative,
    )


@attrs.define(kw_only=True)
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO dynamic sampling."""

    enable: bool = option(
        False,
        "Drop groups whose metric is the same for every response "
        "and sample more prompts to fill the batch.",
        verl="algorithm.filter_groups.enable",
    )
    metric: str = option(
        "acc",
        "Per-response value compared within a group (a reward extra field, or 'score').",
        verl="algorithm.filter_groups.metric",
    )
    max_num_gen_batches: int = option(
        0,
        "Generation rounds allowed per step before giving up; 0 is unlimited.",
        verl="algorithm.filter_groups.max_num_gen_batches",
        validator=non_negative,
    )


@attrs.define(kw_only=True)
class AlgorithmConfig:
    """The ``algorithm`` section."""

    adv_estimator: str = option(
        "grpo",
        "Advantage estimator.",
        verl="algorithm.adv_estimator",
        registry="advantage_estimators",
    )
    adv_estimator_args: dict[str, Any] = option(
        factory=dict, help="Options of the chosen estimator (its own config class)."
    )
    gamma: float = option(1.0, "Discount factor (gae, reinforce++).", verl="algorithm.gamma")
    lam: float = option(1.0, "GAE lambda.", verl="algorithm.lam")
    norm_adv_by_std_in_grpo: bool = option(
        True,
        "Divide GRPO advantages by the group std; false is Dr.GRPO.",
        verl="algorithm.norm_adv_by_std_in_grpo",
    )
    use_kl_in_reward: bool = option(
        False, "Subtract a KL penalty from token rewards (PPO).", verl="algorithm.use_kl_in_reward"
    )
    kl_penalty: str = option(
        "kl",
        "KL estimator used in the reward.",
        verl="algorithm.kl_penalty",
        registry="kl_penalties",
    )
    kl_ctrl: KLControlConfig = section(
        KLControlConfig, "KL-in-reward controller.", verl="algorithm.kl_ctrl"
    )
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, "DAPO dynamic sampling.", verl="algorithm.filter_groups"
    )
    rollout_is: str | None = option(
        None,
        "Importance-weight correction of off-policy samples against the rollout "
        "log-probs: null, 'token' or 'sequence' (truncated IS).",
        verl="algorithm.rollout_is",
        choices=[None, "token", "sequence"],
    )
    rollout_is_threshold: float = option(
        2.0,
        "Upper truncation of the importance weights.",
        verl="algorithm.rollout_is_threshold",
        validator=positive,
    )


class AdvantageEstimator(ABC):
    """Turns token-level rewards (and values, if it needs them) into advantages."""

    requires: ClassVar[tuple[str, ...]] = ("token_level_rewards", "response_mask")
    """Batch columns :meth:`compute` reads. ``values`` makes the run train a critic;
    ``reward_baselines`` makes the scheduler compute greedy baselines (ReMax)."""

    def __init__(self, config: AlgorithmConfig, args: Any = None) -> None:
        """``args``: ``algorithm.adv_estimator_args`` read into the config class the estimator
        was registered with (``register(..., config=...)``), or ``None`` without one."""
        self.config = config
        self.args = args

    @abstractmethod
    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(advantages, returns)``, each [B, R] and zero where ``response_mask`` is 0.

        Groups (responses to the same prompt) share the non-tensor column ``uid``.
        """


class PolicyLoss(ABC):
    """A policy-gradient loss over one micro-batch."""

    def __init__(self, config: ActorConfig, args: Any = None) -> None:
        """``args``: ``actor.policy_loss_args`` read into the config class the loss was
        registered with (``register(..., config=...)``), or ``None`` without one."""
        self.config = config
        self.args = args

    @abstractmethod
    def __call__(
        self,
        *,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        aggregate: Aggregate,
        importance_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the aggregated loss and its metrics (``actor/pg_loss``,
        ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``): ``pg_loss`` is
        the returned loss, the others are means over this micro-batch's valid tokens.

        ``importance_weights`` [b, R], when given, multiply the per-token loss (correction of
        stale samples; already truncated, no gradient).
        """


class ActorObjective(Protocol):
    """The whole actor loss of a micro-batch: policy loss, KL loss and entropy bonus.

    A backend calls it once per micro-batch with the log-probs (and entropy) it computed with
    gradient; it must be picklable, since it travels to the workers. The loss and every metric
    it returns are this micro-batch's share: summed over the micro-batches of a mini-batch and
    averaged over data-parallel ranks they give the mini-batch's value.
    """

    needs_entropy: bool
    needs_ref: bool

    def __call__(
        self,
        micro_batch: Batch,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        scale: LossScale,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...
