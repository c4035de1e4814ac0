"""Learning-health checks: read each training step's metrics and say when a run trains without
learning (every response cut off, no reward variance, a zero gradient, a collapsed entropy, a
reward that never changes, a policy running away from its reference).

A check is a part like any other: registered with ``register_health_checks``, chosen by the
list ``trainer.health.checks``, built in the driver as ``HealthCheck(config, context)``. It
only says whether its condition holds on a step (:meth:`HealthCheck.observe` returns a
:class:`Finding`); the core counts the steps it holds, fires once when it has held for the
check's ``patience``, writes the one-line warning and ``health/<name>`` = 1 into that step's
metrics, and re-arms the check once the condition clears.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.config import option, positive

if TYPE_CHECKING:
    from plugrl.parts.context import PartContext

HEALTH_MODES = ("warn", "error", "off")


@attrs.define(kw_only=True)
class HealthCheckConfig:
    """Base of a health check's options (``trainer.health.check_args.<name>``). A check's own
    config class extends it, and may give ``patience`` another default."""

    patience: int = option(
        3,
        "Consecutive training steps the condition must hold before the check fires.",
        validator=positive,
    )


@attrs.define(kw_only=True)
class HealthConfig:
    """``trainer.health``: which learning-health checks watch the run, and what a check that
    fires does."""

    mode: str = option(
        "warn",
        "'warn': a check that fires logs one line and sets health/<check> = 1 in that step's "
        "metrics; 'error': the same, then the run stops with that line; 'off': no checks.",
        choices=list(HEALTH_MODES),
    )
    checks: list[str] = option(
        factory=lambda: [
            "response_clipping",
            "zero_variance",
            "grad_norm",
            "entropy_collapse",
            "constant_reward",
            "kl_explosion",
        ],
        help="Health checks to run (registered names); default: every built-in one.",
        registry="health_checks",
    )
    check_args: dict[str, dict[str, Any]] = option(
        factory=dict,
        help="Options of each check, by check name (patience, thresholds; its config class "
        "checks them).",
    )


@attrs.frozen
class Finding:
    """What a check saw on one step: the metric that shows the problem, its value, the
    problem in words, and the usual fix. The core adds the check's name and the steps the
    condition held."""

    metric: str
    """The metric's name (``response_length/clip_ratio``)."""
    value: float
    """Its value on the step."""
    problem: str
    """What is wrong, in a few words (``every response was cut at data.max_response_length``)."""
    fix: str
    """The usual fix, naming recipe keys (``raise data.max_response_length``)."""


class HealthCheck(ABC):
    """One learning-health check. Built once per run in the driver as
    ``HealthCheck(config, context)``: ``config`` is the check's config class read from
    ``trainer.health.check_args.<name>`` (:class:`HealthCheckConfig` when it registered none),
    ``context.recipe`` the run. It may keep state across steps (a baseline of its first
    values): :meth:`state_dict` gives it to the run's checkpoints and :meth:`load_state_dict`
    takes it back on resume, so a resumed run judges its steps as the uninterrupted one."""

    def __init__(self, config: HealthCheckConfig, context: PartContext) -> None:
        self.config = config
        self.context = context

    @abstractmethod
    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        """Look at training step ``step``'s metrics (verl's names, before they are logged);
        return a :class:`Finding` while the condition holds on this step, ``None`` while it
        does not or the metrics do not tell (a metric this run does not log). Called once per
        step, in step order."""

    def state_dict(self) -> dict[str, Any]:
        """What the check keeps across steps, for the run's checkpoints: tensors and plain
        values only (numbers, strings, lists, dicts). Default: nothing."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave, when the run resumes."""


def metric_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """``metrics[name]`` as a float (a torch or numpy scalar unwrapped), ``None`` when it is
    missing or not a number. NaN and infinities are returned as they are."""
    value = metrics.get(name)
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (TypeError, ValueError):  # an array of several values
            return None
    if not isinstance(value, (int, float)):
        return None
    return float(value)


def format_value(value: float) -> str:
    """A metric value for a one-line message: 4 significant digits, ``nan`` and ``inf`` as
    such."""
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
