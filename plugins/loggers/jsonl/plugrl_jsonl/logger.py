"""``metrics.jsonl`` in the run folder: one JSON object per step, appended and flushed."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.api.loggers import METRICS_FILE, MetricLogger

if TYPE_CHECKING:
    from plugrl.api import PartContext, TrainerConfig


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # torch / numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible instead of failing
    return value


class JsonlLogger(MetricLogger):
    """Appends ``{"step": N, ...metrics}`` lines; a resumed run appends to the same file
    after dropping the lines of steps it is about to redo."""

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.path = Path(self.run_dir) / METRICS_FILE
        self._file = None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._file is None:
            self._truncate_from(step)
            self._file = self.path.open("a", encoding="utf-8")
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def _truncate_from(self, step: int) -> None:
        """Keep only records of earlier steps (a resumed run redoes the later ones)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) < step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def close(self, status: str = "completed", error: str | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
