"""Built-in metric loggers: ``console`` (one line per step), ``jsonl`` (metrics.jsonl), and
the experiment trackers ``tensorboard``, ``wandb``, ``mlflow`` and ``swanlab``, each usable
once its library is installed (``pip install 'plugrl[loggers]'`` installs all four)."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_loggers(register):
    register("console", "plugrl_plugins.loggers.console:ConsoleLogger")
    register("jsonl", "plugrl_plugins.loggers.jsonl:JsonlLogger")
    register(
        "tensorboard",
        "plugrl_plugins.loggers.tensorboard:TensorBoardLogger",
        requires=["tensorboard"],
        install="pip install 'plugrl[tensorboard]'",
        description="TensorBoard event files in <run folder>/tensorboard ($TENSORBOARD_DIR)",
    )
    register(
        "wandb",
        "plugrl_plugins.loggers.wandb:WandbLogger",
        requires=["wandb"],
        install="pip install 'plugrl[wandb]'",
        description="Weights & Biases run, offline in the run folder unless $WANDB_MODE is set",
    )
    register(
        "mlflow",
        "plugrl_plugins.loggers.mlflow:MlflowLogger",
        requires=["mlflow"],
        install="pip install 'plugrl[mlflow]'",
        description="MLflow run in <run folder>/mlflow.db, or $MLFLOW_TRACKING_URI",
    )
    register(
        "swanlab",
        "plugrl_plugins.loggers.swanlab:SwanlabLogger",
        requires=["swanlab"],
        install="pip install 'plugrl[swanlab]'",
        description="SwanLab run, offline in the run folder unless $SWANLAB_MODE is set",
    )
