"""The ``fully_async`` scheduler: engines generate on their own devices while the trainer
trains, within a bound on how stale a trained sample may be (verl's fully-async recipe)."""

from __future__ import annotations

from plugrl.api import hookimpl

from .config import FullyAsyncConfig


@hookimpl
def register_schedulers(register):
    register(
        "fully_async",
        "plugrl_fully_async.scheduler:FullyAsyncScheduler",
        config=FullyAsyncConfig,
        description="rollout and training overlap on separate devices; bounded staleness, "
        "partial rollout, importance-weight correction",
    )
