"""The metric-logger interface, what trackers share (scalars, flat params, resuming the same
tracked run) and the run's metrics file."""

from plugrl.parts.logger import (
    MetricLogger,
    RunIdFile,
    continues_earlier_run,
    flat_params,
    scalars,
)
from plugrl.run.metrics import METRICS_FILE, mean_metrics, read_metrics

__all__ = [
    "METRICS_FILE",
    "MetricLogger",
    "RunIdFile",
    "continues_earlier_run",
    "flat_params",
    "mean_metrics",
    "read_metrics",
    "scalars",
]
