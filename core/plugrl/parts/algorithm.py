"""Algorithm pieces: advantage estimators, policy losses, KL penalties, and the objective they
make together."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs

from plugrl.config import ConfigValueError, non_negative, option, positive, section

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.parts.context import PartContext

Aggregate = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``aggregate(values [b, R], mask [b, R]) -> scalar``: reduces per-token values the way
``actor.loss_agg_mode`` says, as this micro-batch's share of the global mini-batch."""


class KLPenalty(Protocol):
    """A KL penalty function, what ``register_kl_penalties`` registers: a plain function of
    this signature (not a class). The core calls it positionally, with gradient through
    ``log_prob`` when it is the KL loss (``actor.kl_loss_type``) and without when it is KL in
    the reward (``algorithm.kl_penalty``, given ``old_log_probs``)."""

    def __call__(self, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        """Per-token penalties [b, R] of the sampled tokens, from their log-probs [b, R] under
        the policy and the reference model; the caller masks padding."""
        ...


@attrs.frozen
class LossScale:
    """What a micro-batch needs to know to contribute its exact share of the global loss.

    ``num_tokens`` and ``num_seqs`` count the valid response tokens and sequences of the whole
    mini-batch across every micro-batch and data-parallel rank; ``dp_size`` is the number of
    data-parallel ranks whose gradients are averaged. An objective returns
    ``dp_size * (its micro-batch part of the global sum) / normaliser`` so that summing over
    micro-batches and averaging over ranks gives the global mean, however the batch was split.
    """

    num_tokens: int
    num_seqs: int
    dp_size: int = 1
    max_response_length: int | None = None
    """``data.max_response_length``: the constant that ``seq-mean-token-sum-norm`` divides by.
    A backend sets it from the recipe, never from the batch's padded width, which changes
    with the longest response of each step. Left unset, the mask width is used (verl's
    ``agg_loss`` default)."""
    loss_scale_factor: int | None = None
    """``actor.loss_scale_factor``: when set, ``seq-mean-token-sum-norm`` divides by it instead
    of ``max_response_length`` (verl's ``loss_scale_factor``)."""
    metric_scale: LossScale | None = None
    """The counts of the sequences the backend ran, when it left out some whose loss is zero
    (:meth:`ActorObjective.rows_without_gradient`): the loss keeps the whole mini-batch's counts
    above, so its gradient is unchanged, and metrics are averaged over the sequences run.
    ``None``: every sequence ran."""

    def for_metrics(self) -> LossScale:
        """The counts metrics are averaged over."""
        return self.metric_scale or self


@attrs.define(kw_only=True)
class PolicyLossConfig:
    """The keys of the actor's loss: the policy loss and its clip ranges, how per-token losses
    are aggregated, the KL loss and the entropy bonus. They sit in the ``actor`` section
    (:class:`~plugrl.parts.backend.ActorConfig` extends this class), and a policy loss is built
    with them."""

    policy_loss: str = option(
        "vanilla",
        "Policy loss.",
        verl="actor_rollout_ref.actor.policy_loss.loss_mode",
        registry="policy_losses",
    )
    policy_loss_args: dict[str, Any] = option(
        factory=dict,
        help="Options of the chosen policy loss (its own config class).",
        verl="actor_rollout_ref.actor.policy_loss",
    )
    clip_ratio: float = option(
        0.2,
        "PPO clip range when clip_ratio_low/high are unset.",
        verl="actor_rollout_ref.actor.clip_ratio",
        validator=non_negative,
    )
    clip_ratio_low: float | None = option(
        None,
        "Lower clip range (ratio >= 1 - low); unset: clip_ratio.",
        verl="actor_rollout_ref.actor.clip_ratio_low",
        validator=non_negative,
    )
    clip_ratio_high: float | None = option(
        None,
        "Upper clip range (ratio <= 1 + high); DAPO's clip-higher uses 0.28.",
        verl="actor_rollout_ref.actor.clip_ratio_high",
        validator=non_negative,
    )
    clip_ratio_c: float = option(
        3.0,
        "Dual-clip bound for negative advantages (must be > 1).",
        verl="actor_rollout_ref.actor.clip_ratio_c",
    )
    loss_agg_mode: str = option(
        "token-mean",
        "How per-token losses become one number, over the global mini-batch.",
        verl="actor_rollout_ref.actor.loss_agg_mode",
        choices=[
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        ],
    )
    loss_scale_factor: int | None = option(
        None,
        "Constant that seq-mean-token-sum-norm divides by; unset: data.max_response_length.",
        verl="actor_rollout_ref.actor.loss_scale_factor",
        validator=positive,
    )
    use_kl_loss: bool = option(
        False,
        "Add a KL(actor || reference) term to the loss (GRPO).",
        verl="actor_rollout_ref.actor.use_kl_loss",
    )
    kl_loss_coef: float = option(
        0.001,
        "Coefficient of the KL loss.",
        verl="actor_rollout_ref.actor.kl_loss_coef",
        validator=non_negative,
    )
    kl_loss_type: str = option(
        "low_var_kl",
        "KL estimator of the KL loss; a '+' suffix (k3+) uses a straight-through gradient.",
        verl="actor_rollout_ref.actor.kl_loss_type",
        registry="kl_penalties",
    )
    entropy_coeff: float = option(
        0.0, "Entropy bonus coefficient.", verl="actor_rollout_ref.actor.entropy_coeff"
    )

    @property
    def effective_clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def effective_clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


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


def parse_rollout_is_threshold(threshold: float | str) -> tuple[float, float | None]:
    """``(upper, lower)`` of ``algorithm.rollout_is_threshold``: a number (or a number as a
    string) truncates at ``upper`` and has no ``lower``; ``"lower_upper"`` (``"0.5_5.0"``,
    verl's spelling) is IcePop: weight 0 outside ``[lower, upper]``. Raises ``ValueError``
    saying what is wrong."""
    text = str(threshold).strip()
    parts = text.split("_") if isinstance(threshold, str) else [text]
    try:
        bounds = [float(part) for part in parts]
    except ValueError:
        bounds = []
    if len(bounds) not in (1, 2):
        raise ValueError(
            "must be a number (truncation) or 'lower_upper' such as '0.5_5.0' (IcePop), "
            f"got {threshold!r}"
        )
    if not all(0 < bound < math.inf for bound in bounds):
        raise ValueError(f"bounds must be finite and > 0, got {threshold!r}")
    if len(bounds) == 1:
        return bounds[0], None
    lower, upper = bounds
    if lower > upper:
        raise ValueError(f"IcePop's lower bound is above its upper one, got {threshold!r}")
    return upper, lower


def _rollout_is_threshold(instance: Any, attribute: attrs.Attribute, value: float | str) -> None:
    try:
        parse_rollout_is_threshold(value)
    except ValueError as exc:
        raise ConfigValueError(attribute.name, str(exc)) from None


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
        verl="algorithm.rollout_correction.rollout_is",
        choices=[None, "token", "sequence"],
    )
    rollout_is_threshold: float | str = option(
        2.0,
        "Upper truncation of the importance weights; a 'lower_upper' string such as "
        "'0.5_5.0' is IcePop: weight 0 outside [lower, upper], the ratio itself inside.",
        verl="algorithm.rollout_correction.rollout_is_threshold",
        validator=_rollout_is_threshold,
    )
    kpop_threshold: float | None = option(
        None,
        "KPop: weight 0 for a token whose two-outcome KL between the trainer's and the "
        "engine's probability of it exceeds this, either way round (0.1 in the method); "
        "needs rollout_is.",
        validator=attrs.validators.optional(positive),
    )


class AdvantageEstimator(ABC):
    """Turns token-level rewards (and values, if it needs them) into advantages."""

    requires: ClassVar[tuple[str, ...]] = ("token_level_rewards", "response_mask")
    """Batch columns :meth:`compute` reads. ``values`` makes the run train a critic;
    ``reward_baselines`` makes the scheduler compute greedy baselines (ReMax)."""

    def __init__(self, config: AlgorithmConfig, context: PartContext) -> None:
        """``config``: the ``algorithm`` section. ``context.options`` (also :attr:`args`):
        ``algorithm.adv_estimator_args`` read into the config class the estimator was
        registered with (``register(..., config=...)``), or ``None`` without one."""
        self.config = config
        self.context = context
        self.args = context.options

    @abstractmethod
    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(advantages, returns)``, each [B, R] and zero where ``response_mask`` is 0.

        Groups (responses to the same prompt) share the non-tensor column ``uid``.
        """


class PolicyLoss(ABC):
    """A policy-gradient loss over one micro-batch."""

    zero_at_zero_advantage: ClassVar[bool] = False
    """True when a token whose advantage is 0 adds exactly nothing to the loss and its
    gradient, whatever the other tokens of the micro-batch: a backend may then leave sequences
    with all-zero advantages out of the update. False (the safe default) for losses that use
    statistics of the whole micro-batch (``clip_cov``, ``kl_cov``) or are not linear in the
    advantage."""

    def __init__(self, config: PolicyLossConfig, context: PartContext) -> None:
        """``config``: the loss keys of the ``actor`` section. ``context.options`` (also
        :attr:`args`): ``actor.policy_loss_args`` read into the config class the loss was
        registered with (``register(..., config=...)``), or ``None`` without one."""
        self.config = config
        self.context = context
        self.args = context.options

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

    def rows_without_gradient(self, micro_batch: Batch) -> torch.Tensor | None:
        """Boolean ``[b]``: the rows whose loss and gradient are exactly zero (all-zero
        advantages, with no term that reads anything else), which a backend may leave out of
        the forward and backward; ``None`` when none can be left out. Optional: a backend
        treats an objective without this method as one that returns ``None``."""
        ...

    def __call__(
        self,
        micro_batch: Batch,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        scale: LossScale,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...
