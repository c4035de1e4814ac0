"""The ``mlflow`` logger: an MLflow run in the run folder's ``mlflow.db``, or at
``$MLFLOW_TRACKING_URI``."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register(
        "mlflow",
        "plugrl_mlflow.logger:MlflowLogger",
        requires=["mlflow"],
        install="pip install 'plugrl[mlflow]'",
        description="MLflow run in <run folder>/mlflow.db, or $MLFLOW_TRACKING_URI",
    )
