"""Reward managers: ``naive``, ``dapo``, ``batch`` and ``parallel`` (verl's names).

Registered by path, so nothing here imports torch until a run chooses one.
"""

from __future__ import annotations

from plugrl.api import hookimpl

_MANAGERS = "plugrl_reward_managers.managers"


@hookimpl
def register_reward_managers(register):
    register(
        "naive",
        f"{_MANAGERS}:NaiveRewardManager",
        description="One call per sample; the score on the last response token",
    )
    register(
        "dapo",
        f"{_MANAGERS}:DAPORewardManager",
        config=f"{_MANAGERS}:DAPORewardConfig",
        description="naive plus DAPO's overlong buffer penalty",
    )
    register(
        "batch",
        f"{_MANAGERS}:BatchRewardManager",
        config=f"{_MANAGERS}:BatchRewardConfig",
        description="One call per scoring function for the whole batch",
    )
    register(
        "parallel",
        f"{_MANAGERS}:ParallelRewardManager",
        config=f"{_MANAGERS}:ParallelRewardConfig",
        description="Per-sample scoring in a pool of processes or Ray actors",
    )
