"""SwanLab: a run per run folder, offline unless ``SWANLAB_MODE`` says otherwise."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import swanlab

from plugrl.api.loggers import MetricLogger, RunIdFile, continues_earlier_run, scalars

if TYPE_CHECKING:
    from plugrl.api import PartContext, TrainerConfig

STATES = {"completed": "success", "failed": "crashed", "interrupted": "aborted"}


class SwanlabLogger(MetricLogger):
    """Metrics per step to a SwanLab experiment named after ``trainer.experiment_name`` in the
    project ``trainer.project_name``, with the recipe as its config. Writes under
    ``<run folder>/swanlog`` (or ``$SWANLAB_LOG_DIR``), offline unless ``$SWANLAB_MODE`` says
    otherwise; a resumed run continues the same experiment (its id is kept in
    ``swanlab_run_id.txt``)."""

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        super().__init__(config, context)
        ids = RunIdFile(self.run_dir, "swanlab")
        run_id = ids.read() if continues_earlier_run(self.recipe, self.run_dir) else None
        self.run = swanlab.init(
            project=config.project_name,
            experiment_name=config.experiment_name,
            config=self.recipe.to_dict(),
            id=run_id,
            resume="allow",
            # the user's own SWANLAB_MODE / SWANLAB_LOG_DIR win; else offline, in the run folder
            mode=os.environ.get("SWANLAB_MODE") or "offline",
            log_dir=os.environ.get("SWANLAB_LOG_DIR") or str(self.run_dir / "swanlog"),
        )
        ids.write(self.run.id)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self, status: str = "completed", error: str | None = None) -> None:
        if self.run is None:
            return
        if self.run.alive:  # SwanLab ends the run itself on Ctrl+C
            state = STATES[status]
            self.run.finish(state=state, error=error if state == "crashed" else None)
        self.run = None
