"""Weights & Biases: a run per run folder, offline unless ``WANDB_MODE`` says otherwise."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import wandb

from plugrl.api.loggers import MetricLogger, RunIdFile, continues_earlier_run, scalars

if TYPE_CHECKING:
    from plugrl.api import PartContext, TrainerConfig

EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 255}


class WandbLogger(MetricLogger):
    """Metrics per step to a W&B run named after ``trainer.experiment_name`` in the project
    ``trainer.project_name``, with the recipe as its config. Writes under the run folder (or
    ``$WANDB_DIR``), offline unless ``$WANDB_MODE`` says otherwise; a resumed run continues
    the same W&B run (its id is kept in ``wandb_run_id.txt``)."""

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        super().__init__(config, context)
        ids = RunIdFile(self.run_dir, "wandb")
        run_id = ids.read() if continues_earlier_run(self.recipe, self.run_dir) else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # the user's own WANDB_MODE / WANDB_DIR win; else offline, in the run folder
        mode = os.environ.get("WANDB_MODE") or "offline"
        # the mode of the whole process too, not only of the run: wandb's own telemetry
        # follows the process's mode and would otherwise reach for its server
        wandb.setup(settings=wandb.Settings(mode=mode))
        self.run = wandb.init(
            project=config.project_name,
            name=config.experiment_name,
            config=self.recipe.to_dict(),
            id=run_id,
            resume="allow",
            mode=mode,
            dir=os.environ.get("WANDB_DIR") or str(self.run_dir),
        )
        ids.write(self.run.id)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # online, W&B ignores a step lower than the last one it has: the steps a resumed run
        # redoes keep the values logged before the interruption
        self.run.log(scalars(metrics), step=step)

    def close(self, status: str = "completed", error: str | None = None) -> None:
        if self.run is not None:
            self.run.finish(exit_code=EXIT_CODES[status])
            self.run = None
