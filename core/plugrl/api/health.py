"""The learning-health check interface: a check reads each training step's metrics and says
when the run trains without learning."""

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
