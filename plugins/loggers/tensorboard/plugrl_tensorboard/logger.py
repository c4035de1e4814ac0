"""TensorBoard event files: ``<run folder>/tensorboard/`` (or ``$TENSORBOARD_DIR``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.tensorboard import SummaryWriter

from plugrl.api.loggers import MetricLogger, scalars

if TYPE_CHECKING:
    from plugrl.api import PartContext, TrainerConfig


def _markdown_code(text: str) -> str:
    """TensorBoard renders text summaries as Markdown: indent to keep the YAML as it is."""
    return "\n".join("    " + line for line in text.splitlines())


class TensorBoardLogger(MetricLogger):
    """Scalars per step in TensorBoard event files, the recipe as a text summary; a resumed
    run appends to the same folder and TensorBoard drops the earlier values of the steps it
    redoes."""

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        super().__init__(config, context)
        # verl's variable: the folder the event files go in
        chosen = os.environ.get("TENSORBOARD_DIR")
        self.log_dir = Path(chosen) if chosen else Path(self.run_dir) / "tensorboard"
        self._writer: SummaryWriter | None = None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._writer is None:
            self._writer = self._open(step)
        for key, value in scalars(metrics).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # a killed run keeps its curves up to the last step

    def _open(self, first_step: int) -> SummaryWriter:
        earlier = self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))
        # purge_step: TensorBoard discards what earlier event files hold for this step and
        # later ones, so the steps a resumed run redoes are not drawn twice
        writer = SummaryWriter(str(self.log_dir), purge_step=first_step if earlier else None)
        writer.add_text("recipe", _markdown_code(self.recipe.to_yaml()), first_step)
        return writer

    def close(self, status: str = "completed", error: str | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
