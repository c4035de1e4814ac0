"""The built-in learning-health checks. Each reads verl's metric names and returns a finding
while its condition holds; the core fires it after ``patience`` steps (docs/recipes.md,
"Health checks", gives each default and why it is safe on a run that learns)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from plugrl.api import ConfigValueError, fraction, non_negative, option, positive
from plugrl.api.health import (
    Finding,
    HealthCheck,
    HealthCheckConfig,
    format_value,
    metric_value,
)

# ------------------------------------------------------------------------ response_clipping


@attrs.define(kw_only=True)
class ResponseClippingConfig(HealthCheckConfig):
    patience: int = option(
        2,
        "Consecutive steps the condition must hold before the check fires.",
        validator=positive,
    )
    min_clip_ratio: float = option(
        1.0,
        "Fire when at least this share of a step's responses reached data.max_response_length "
        "(response_length/clip_ratio); 1.0: every response.",
        validator=fraction,
    )


class ResponseClipping(HealthCheck):
    """Every response cut at ``data.max_response_length``: no response ends, so the reward
    reads unfinished answers."""

    config: ResponseClippingConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        ratio = metric_value(metrics, "response_length/clip_ratio")
        if ratio is None or not ratio >= self.config.min_clip_ratio:
            return None
        share = "every response" if ratio >= 1.0 else f"{ratio:.0%} of the responses"
        return Finding(
            metric="response_length/clip_ratio",
            value=ratio,
            problem=f"{share} reached data.max_response_length, so the reward scores "
            "unfinished answers",
            fix="raise data.max_response_length, or lower rollout.temperature (a model that "
            "repeats itself never stops)",
        )


# ---------------------------------------------------------------------------- zero_variance


@attrs.define(kw_only=True)
class ZeroVarianceConfig(HealthCheckConfig):
    tolerance: float = option(
        1e-6,
        "Advantages within this of 0 count as 0.",
        validator=non_negative,
    )


class ZeroVariance(HealthCheck):
    """Every advantage 0: with a group estimator (GRPO, RLOO, ...), every group's responses
    scored alike, and the step has no learning signal."""

    config: ZeroVarianceConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        highest = metric_value(metrics, "critic/advantages/max")
        lowest = metric_value(metrics, "critic/advantages/min")
        if highest is None or lowest is None:
            return None
        spread = max(abs(highest), abs(lowest))
        if not spread <= self.config.tolerance:
            return None
        return Finding(
            metric="critic/advantages/max",
            value=highest,
            problem="every advantage is 0: in each group all responses scored alike (zero "
            "reward variance), so the step has no learning signal",
            fix="train on prompts the model solves only sometimes (filter the data by pass "
            "rate), raise rollout.n, or set algorithm.filter_groups.enable=true (dynamic "
            "sampling)",
        )


# -------------------------------------------------------------------------------- grad_norm


@attrs.define(kw_only=True)
class GradNormConfig(HealthCheckConfig):
    patience: int = option(
        2,
        "Consecutive steps the condition must hold before the check fires (the backends "
        "skip the optimizer step of a non-finite gradient, so one such step does no harm).",
        validator=positive,
    )
    min_grad_norm: float = option(
        0.0,
        "Fire when actor/grad_norm is at or below this (0: an exactly zero gradient), or not "
        "finite.",
        validator=non_negative,
    )


class GradNorm(HealthCheck):
    """``actor/grad_norm`` zero (the loss does not reach the weights) or not finite (the
    update diverged)."""

    config: GradNormConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        norm = metric_value(metrics, "actor/grad_norm")
        if norm is None:
            return None
        if not math.isfinite(norm):
            return Finding(
                metric="actor/grad_norm",
                value=norm,
                problem="the gradient is not finite, so the optimizer steps are skipped (or "
                "the weights are already broken)",
                fix="lower actor.optim.lr, keep actor.grad_clip on, train in bfloat16 or "
                "float32 rather than float16, and check that rewards are finite",
            )
        if norm > self.config.min_grad_norm:
            return None
        return Finding(
            metric="actor/grad_norm",
            value=norm,
            problem="the gradient is zero, so the weights do not move",
            fix="if every advantage is 0, see the zero_variance check; otherwise check which "
            "parameters train (model.lora_rank and model.target_modules) and that "
            "actor.loss_scale_factor is not 0",
        )


# ------------------------------------------------------------------------- entropy_collapse


def _check_drop(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 1.0:
        raise ConfigValueError(attribute.name, f"must be > 1 (a factor of fall), got {value!r}")


@attrs.define(kw_only=True)
class EntropyCollapseConfig(HealthCheckConfig):
    patience: int = option(
        5,
        "Consecutive steps the condition must hold before the check fires.",
        validator=positive,
    )
    min_entropy: float = option(
        1e-3,
        "Fire when actor/entropy (nats per token) is below this.",
        validator=non_negative,
    )
    max_fall: float = option(
        20.0,
        "Fire when actor/entropy has fallen below 1/max_fall of its mean over the first "
        "baseline_steps steps.",
        validator=_check_drop,
    )
    baseline_steps: int = option(
        3,
        "Steps whose mean entropy is the baseline max_fall compares with.",
        validator=positive,
    )


class EntropyCollapse(HealthCheck):
    """``actor/entropy`` below a floor, or fallen by a large factor from its first values:
    the policy samples one answer and has stopped exploring."""

    config: EntropyCollapseConfig

    def __init__(self, config: EntropyCollapseConfig, context: Any) -> None:
        super().__init__(config, context)
        self.first_values: list[float] = []

    def state_dict(self) -> dict[str, Any]:
        return {"first_values": list(self.first_values)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first_values = [float(value) for value in state.get("first_values", [])]

    @property
    def baseline(self) -> float | None:
        """The mean entropy of the first ``baseline_steps`` steps, once they are seen."""
        if len(self.first_values) < self.config.baseline_steps:
            return None
        return sum(self.first_values) / len(self.first_values)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        entropy = metric_value(metrics, "actor/entropy")
        if entropy is None or not math.isfinite(entropy):
            return None
        baseline = self.baseline
        if baseline is None:
            self.first_values.append(entropy)
        fix = (
            "lower actor.optim.lr, raise actor.clip_ratio_high (clip-higher, 0.28), add "
            "actor.entropy_coeff, or raise rollout.temperature"
        )
        if entropy < self.config.min_entropy:
            return Finding(
                metric="actor/entropy",
                value=entropy,
                problem=f"the policy's entropy is below {format_value(self.config.min_entropy)}: "
                "it samples one answer and has stopped exploring",
                fix=fix,
            )
        if baseline is not None and entropy < baseline / self.config.max_fall:
            return Finding(
                metric="actor/entropy",
                value=entropy,
                problem=f"the policy's entropy fell to 1/{baseline / entropy:.0f} of its first "
                f"steps' {format_value(baseline)}: it has stopped exploring",
                fix=fix,
            )
        return None


# -------------------------------------------------------------------------- constant_reward


@attrs.define(kw_only=True)
class ConstantRewardConfig(HealthCheckConfig):
    tolerance: float = option(
        1e-9,
        "Scores within this of each other count as one value.",
        validator=non_negative,
    )


class ConstantReward(HealthCheck):
    """Every response of the batch got the same score (``critic/score/max`` equals
    ``critic/score/min``) while the responses differ (their lengths vary): the reward
    function returns one constant."""

    config: ConstantRewardConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        highest = metric_value(metrics, "critic/score/max")
        lowest = metric_value(metrics, "critic/score/min")
        if highest is None or lowest is None or not highest - lowest <= self.config.tolerance:
            return None
        longest = metric_value(metrics, "response_length/max")
        shortest = metric_value(metrics, "response_length/min")
        if longest is not None and shortest is not None and longest <= shortest:
            return None  # identical-looking responses may deserve one score
        return Finding(
            metric="critic/score/max",
            value=highest,
            problem="every response of the batch got this one score while the responses "
            "differ: the reward function returns a constant",
            fix="check the reward function of the data_source (trainer.rollout_data_dir writes "
            "each scored response): a ground truth in the wrong column, an answer format it "
            "never parses, or an error turned into a default score",
        )


# ----------------------------------------------------------------------------- kl_explosion


@attrs.define(kw_only=True)
class KLExplosionConfig(HealthCheckConfig):
    patience: int = option(
        2,
        "Consecutive steps the condition must hold before the check fires.",
        validator=positive,
    )
    max_ppo_kl: float = option(
        0.5,
        "Fire when |actor/ppo_kl| (the update's KL from the rollout policy) is above this.",
        validator=positive,
    )
    max_kl_loss: float = option(
        1.0,
        "Fire when actor/kl_loss (KL from the reference model) is above this.",
        validator=positive,
    )
    max_is_outside_fraction: float = option(
        0.2,
        "Fire when rollout_corr/rollout_is_ratio_fraction_high plus _low (the share of "
        "importance weights outside [1/threshold, threshold]) is above this.",
        validator=fraction,
    )


class KLExplosion(HealthCheck):
    """The policy running away: ``actor/ppo_kl`` or ``actor/kl_loss`` above a bound (or not
    finite), or most importance weights against the rollout policy truncated."""

    config: KLExplosionConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        ppo_kl = metric_value(metrics, "actor/ppo_kl")
        if ppo_kl is not None and not abs(ppo_kl) <= self.config.max_ppo_kl:
            return Finding(
                metric="actor/ppo_kl",
                value=ppo_kl,
                problem="the update moved the policy far from the one that sampled",
                fix="lower actor.optim.lr or actor.ppo_epochs, or narrow actor.clip_ratio",
            )
        kl_loss = metric_value(metrics, "actor/kl_loss")
        if kl_loss is not None and not kl_loss <= self.config.max_kl_loss:
            return Finding(
                metric="actor/kl_loss",
                value=kl_loss,
                problem="the policy ran far from the reference model",
                fix="raise actor.kl_loss_coef or lower actor.optim.lr",
            )
        high = metric_value(metrics, "rollout_corr/rollout_is_ratio_fraction_high")
        low = metric_value(metrics, "rollout_corr/rollout_is_ratio_fraction_low")
        if high is None and low is None:
            return None
        outside = (high or 0.0) + (low or 0.0)
        if outside <= self.config.max_is_outside_fraction:
            return None
        return Finding(
            metric="rollout_corr/rollout_is_ratio_fraction_high+low",
            value=outside,
            problem="most importance weights are truncated: the engines sample from a policy "
            "far from the trainer's",
            fix="check that weights reach the engines, lower scheduler.staleness_threshold, "
            "and sample in the trainer's dtype",
        )
