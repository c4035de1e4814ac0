"""MLflow: a run in the experiment ``trainer.project_name``, stored in the run folder's
``mlflow.db`` unless ``MLFLOW_TRACKING_URI`` names another store or a tracking server."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plugrl.api import PluginError
from plugrl.api.loggers import MetricLogger, RunIdFile, continues_earlier_run, flat_params, scalars

if TYPE_CHECKING:
    from plugrl.api import PartContext, TrainerConfig

logger = logging.getLogger("plugrl.loggers")

STATUSES = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
MAX_PARAM_LENGTH = 6000  # MLflow refuses longer parameter values
_NOT_ALLOWED = re.compile(r"[^/\w.\- :]")  # MLflow's rule for metric and parameter names


def mlflow_key(name: str) -> str:
    """A metric name MLflow accepts: ``@`` becomes ``_at_`` as in verl
    (``val-core/gsm8k/acc/mean_at_1``), other characters it refuses become ``_``."""
    key = _NOT_ALLOWED.sub("_", name.replace("@", "_at_"))
    return "/".join(part for part in key.split("/") if part not in ("", ".", "..")) or "_"


def default_tracking_uri(run_dir: os.PathLike[str] | str) -> str:
    path = os.path.abspath(os.path.join(run_dir, "mlflow.db"))
    return f"sqlite:///{path}"


def _without_telemetry_unless_asked() -> None:
    """Keep a run that stores its MLflow data in the run folder off the network: MLflow's
    usage telemetry is decided when ``mlflow`` is first imported, so this comes first. A user
    who set ``MLFLOW_DISABLE_TELEMETRY`` or ``DO_NOT_TRACK`` keeps their choice."""
    if not (os.environ.get("MLFLOW_DISABLE_TELEMETRY") or os.environ.get("DO_NOT_TRACK")):
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"


class MlflowLogger(MetricLogger):
    """Metrics per step to an MLflow run named after ``trainer.experiment_name``, the recipe
    as its parameters (``actor.optim.lr``, ...). A resumed run continues the same MLflow run
    (its id is kept in ``mlflow_run_id.txt``); a failed run ends ``FAILED``."""

    def __init__(self, config: TrainerConfig, context: PartContext) -> None:
        super().__init__(config, context)
        chosen = os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = chosen or default_tracking_uri(self.run_dir)
        self._in_run_folder = not chosen
        if self._in_run_folder:
            _without_telemetry_unless_asked()
        if self.tracking_uri.startswith("sqlite:"):
            missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
            if missing:
                raise PluginError(
                    f"the mlflow logger's store {self.tracking_uri} needs {', '.join(missing)} "
                    "(pip install 'plugrl[mlflow]'), or set MLFLOW_TRACKING_URI to a tracking "
                    "server"
                )
        from mlflow.tracking import MlflowClient

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        ids = RunIdFile(self.run_dir, "mlflow")
        earlier = ids.read() if continues_earlier_run(self.recipe, self.run_dir) else None
        self.run_id = self._reopen(earlier) if earlier else None
        if self.run_id is None:
            run = self.client.create_run(
                self._experiment_id(config.project_name), run_name=config.experiment_name
            )
            self.run_id = run.info.run_id
        ids.write(self.run_id)
        self._log_params()

    def _experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        artifacts = None
        if self._in_run_folder:
            # beside the database, not in the working directory
            artifacts = (self.run_dir / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=artifacts)

    def _reopen(self, run_id: str) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException:
            logger.warning(
                "mlflow: run %s (from mlflow_run_id.txt) is not in %s; starting a new run",
                run_id,
                self.tracking_uri,
            )
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _log_params(self) -> None:
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        params, changed = [], []
        for name, value in flat_params(self.recipe.to_dict()):
            key, value = mlflow_key(name), value[:MAX_PARAM_LENGTH]
            if key not in logged:
                params.append(Param(key, value))
            elif logged[key] != value:
                changed.append(key)
        if params:
            self.client.log_batch(self.run_id, params=params)
        if changed:
            # a parameter of an MLflow run cannot change once logged
            logger.warning(
                "mlflow: the resumed run keeps its earlier values of %s", ", ".join(changed)
            )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(mlflow_key(key), float(value), now, step)
            for key, value in scalars(metrics).items()
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str = "completed", error: str | None = None) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, STATUSES[status])
            self.run_id = None
