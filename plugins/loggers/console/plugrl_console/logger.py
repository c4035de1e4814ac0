"""One line per step on stderr, with the figures people watch."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from plugrl.api.loggers import MetricLogger

# (metric, short label, format) in the order they are printed when present
SUMMARY = [
    ("critic/score/mean", "score", "{:.3f}"),
    ("val-core/acc", "val_acc", "{:.3f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/kl_loss", "kl", "{:.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/grad_norm", "grad", "{:.3f}"),
    ("response_length/mean", "resp_len", "{:.1f}"),
    ("timing_s/step", "step_s", "{:.2f}"),
]


def summary_line(metrics: Mapping[str, Any], step: int) -> str:
    parts = [f"step {step}"]
    for key, label, fmt in SUMMARY:
        value = metrics.get(key)
        if value is None and key == "val-core/acc":
            # val-core/<data_source>/acc/mean@N: show the first one
            value = next(
                (v for k, v in metrics.items() if k.startswith("val-core/") and "/acc/" in k), None
            )
        if isinstance(value, (int, float)):
            parts.append(f"{label} {fmt.format(value)}")
    return " | ".join(parts)


class ConsoleLogger(MetricLogger):
    """Prints ``step N | score 0.42 | pg_loss ... | step_s 1.23`` after each step."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        print(summary_line(metrics, step), file=sys.stderr, flush=True)
