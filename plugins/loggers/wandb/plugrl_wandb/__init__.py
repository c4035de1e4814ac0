"""The ``wandb`` logger: a Weights & Biases run, offline in the run folder unless
``$WANDB_MODE`` says otherwise."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register(
        "wandb",
        "plugrl_wandb.logger:WandbLogger",
        requires=["wandb"],
        install="pip install 'plugrl[wandb]'",
        description="Weights & Biases run, offline in the run folder unless $WANDB_MODE is set",
    )
