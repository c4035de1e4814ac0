"""The metric-logger interface, what trackers share (scalars, flat params, resuming the same
tracked run) and the run's metrics file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "METRICS_FILE": ("plugrl.run.metrics", "METRICS_FILE"),
        "MetricLogger": ("plugrl.parts.logger", "MetricLogger"),
        "RunIdFile": ("plugrl.parts.logger", "RunIdFile"),
        "continues_earlier_run": ("plugrl.parts.logger", "continues_earlier_run"),
        "flat_params": ("plugrl.parts.logger", "flat_params"),
        "mean_metrics": ("plugrl.run.metrics", "mean_metrics"),
        "read_metrics": ("plugrl.run.metrics", "read_metrics"),
        "scalars": ("plugrl.parts.logger", "scalars"),
    },
)
