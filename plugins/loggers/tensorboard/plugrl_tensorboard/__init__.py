"""The ``tensorboard`` logger: TensorBoard event files in the run folder."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register(
        "tensorboard",
        "plugrl_tensorboard.logger:TensorBoardLogger",
        requires=["tensorboard"],
        install="pip install 'plugrl[tensorboard]'",
        description="TensorBoard event files in <run folder>/tensorboard ($TENSORBOARD_DIR)",
    )
