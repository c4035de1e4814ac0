"""The run's learning-health monitor: every check ``trainer.health.checks`` chooses sees each
training step's metrics before they are logged; a check whose condition has held for its
``patience`` steps fires once (a warning line naming the metric, the steps and the usual fix,
and ``health/<check>`` = 1 in that step's metrics), and fires again only after the condition
cleared. With ``trainer.health.mode: error`` the run stops with the line instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.errors import HealthError, PluginError, PlugrlError
from plugrl.parts.context import PartContext
from plugrl.parts.health import Finding, HealthCheck, format_value
from plugrl.plugin.build import build_part

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.run.health")

METRIC_PREFIX = "health/"


@attrs.define
class WatchedCheck:
    """One check and how long its condition has held."""

    name: str
    plugin: str
    check: HealthCheck
    patience: int
    first_step: int | None = None
    """The first step of the current run of steps on which the condition held."""
    held: int = 0
    """Consecutive steps the condition has held."""
    fired: bool = False
    """Whether it fired in the current run of steps (it re-arms when the condition clears)."""


@attrs.frozen
class Alarm:
    """A check that fired on a step, with its one line."""

    check: str
    line: str


def alarm_line(name: str, finding: Finding, first_step: int, last_step: int) -> str:
    """``health check 'response_clipping': response_length/clip_ratio = 1 on steps 3-4:
    every response was cut ...; usual fix: raise ...``."""
    steps = f"step {last_step}" if first_step == last_step else f"steps {first_step}-{last_step}"
    return (
        f"health check {name!r}: {finding.metric} = {format_value(finding.value)} on {steps}: "
        f"{finding.problem}; usual fix: {finding.fix}"
    )


class HealthMonitor:
    """The checks of one run, observed step by step."""

    def __init__(self, checks: list[WatchedCheck], mode: str = "warn") -> None:
        self.checks = checks
        self.mode = mode

    @classmethod
    def from_recipe(
        cls, recipe: Recipe, plugins: PluginManager, run_dir: Path | None = None
    ) -> HealthMonitor:
        """Build every check the recipe chooses (none with ``trainer.health.mode: off``)."""
        from plugrl.recipe.build import health_check_args, health_check_names

        context = PartContext(recipe=recipe, plugins=plugins, run_dir=run_dir)
        registry = plugins.registry("health_checks")
        checks = []
        for name in health_check_names(recipe, plugins):
            config = health_check_args(recipe, name, plugins)
            check = build_part("health_checks", name, config, context)
            checks.append(WatchedCheck(name, registry.get(name).plugin, check, config.patience))
        return cls(checks, recipe.trainer.health.mode)

    def observe(self, step: int, metrics: MutableMapping[str, Any]) -> list[Alarm]:
        """Show training step ``step``'s metrics to every check; the checks that fire add
        ``health/<name>`` = 1 to ``metrics`` and are returned (logged as warnings here, except
        in ``error`` mode, where :meth:`raise_if_stopping` ends the run with the line)."""
        alarms = []
        for watched in self.checks:
            finding = self._ask(watched, step, metrics)
            if finding is None:
                watched.first_step, watched.held, watched.fired = None, 0, False
                continue
            if watched.first_step is None:
                watched.first_step = step
            watched.held += 1
            if watched.held >= watched.patience and not watched.fired:
                watched.fired = True
                line = alarm_line(watched.name, finding, watched.first_step, step)
                metrics[f"{METRIC_PREFIX}{watched.name}"] = 1.0
                if self.mode != "error":  # in error mode the line ends the run instead
                    logger.warning("%s", line)
                alarms.append(Alarm(watched.name, line))
        return alarms

    def state_dict(self) -> dict[str, Any]:
        """How long each check's condition has held, and the check's own state, by check name,
        for the run's checkpoints (plain data)."""
        return {
            watched.name: {
                "first_step": watched.first_step,
                "held": watched.held,
                "fired": watched.fired,
                "check": watched.check.state_dict(),
            }
            for watched in self.checks
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Go on from a checkpoint's :meth:`state_dict`, so that a resumed run fires on the
        steps the uninterrupted one fires on. A check the checkpoint does not know (added
        since) starts afresh; one it knows that the recipe dropped is ignored."""
        for watched in self.checks:
            saved = (state or {}).get(watched.name)
            if not saved:
                continue
            watched.first_step = saved["first_step"]
            watched.held = int(saved["held"])
            watched.fired = bool(saved["fired"])
            watched.check.load_state_dict(saved.get("check") or {})

    def raise_if_stopping(self, alarms: list[Alarm]) -> None:
        """In ``error`` mode, stop the run with the first alarm's line (the others of the
        same step are logged)."""
        if alarms and self.mode == "error":
            for alarm in alarms[1:]:
                logger.warning("%s", alarm.line)
            raise HealthError(
                f"{alarms[0].line} (trainer.health.mode=error stops the run; "
                "trainer.health.mode=warn only warns)"
            )

    @staticmethod
    def _ask(watched: WatchedCheck, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        try:
            finding = watched.check.observe(step, metrics)
        except PlugrlError:
            raise
        except Exception as exc:
            raise PluginError(
                f"health check {watched.name!r} from plugin {watched.plugin!r} failed on step "
                f"{step}: {type(exc).__name__}: {exc}"
            ) from exc
        if finding is not None and not isinstance(finding, Finding):
            raise PluginError(
                f"health check {watched.name!r} from plugin {watched.plugin!r} returned "
                f"{type(finding).__name__} from observe(); return a plugrl.api.health.Finding "
                "or None"
            )
        return finding
