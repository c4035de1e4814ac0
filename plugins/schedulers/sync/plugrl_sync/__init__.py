"""The ``sync`` scheduler: generate, then train, one step after another (verl's PPO loop)."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_schedulers(register):
    register(
        "sync",
        "plugrl_sync.scheduler:SyncScheduler",
        description="generate, score, estimate, update, sync weights; one step at a time",
    )
