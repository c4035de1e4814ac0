"""The learning-health check interface: a check reads each training step's metrics and says
when the run trains without learning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.errors import HealthError
    from plugrl.parts.health import (
        Finding,
        HealthCheck,
        HealthCheckConfig,
        HealthConfig,
        format_value,
        metric_value,
    )

__all__ = [
    "Finding",
    "HealthCheck",
    "HealthCheckConfig",
    "HealthConfig",
    "HealthError",
    "format_value",
    "metric_value",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "Finding": ("plugrl.parts.health", "Finding"),
        "HealthCheck": ("plugrl.parts.health", "HealthCheck"),
        "HealthCheckConfig": ("plugrl.parts.health", "HealthCheckConfig"),
        "HealthConfig": ("plugrl.parts.health", "HealthConfig"),
        "HealthError": ("plugrl.errors", "HealthError"),
        "format_value": ("plugrl.parts.health", "format_value"),
        "metric_value": ("plugrl.parts.health", "metric_value"),
    },
)
