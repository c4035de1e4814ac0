"""The ``swanlab`` logger: a SwanLab run, offline in the run folder unless
``$SWANLAB_MODE`` says otherwise."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register(
        "swanlab",
        "plugrl_swanlab.logger:SwanlabLogger",
        requires=["swanlab"],
        install="pip install 'plugrl[swanlab]'",
        description="SwanLab run, offline in the run folder unless $SWANLAB_MODE is set",
    )
