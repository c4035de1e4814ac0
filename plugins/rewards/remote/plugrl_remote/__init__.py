"""The ``remote`` reward manager: responses scored by an HTTP server (a sandbox farm, a reward
model behind an API, ``plugrl serve reward``, an OpenRLHF remote reward server).

Registered by path, so nothing here imports httpx or torch until a run chooses it.
"""

from __future__ import annotations

from plugrl.api import hookimpl

_MANAGER = "plugrl_remote.manager"


@hookimpl
def register_reward_managers(register):
    register(
        "remote",
        f"{_MANAGER}:RemoteRewardManager",
        config=f"{_MANAGER}:RemoteRewardConfig",
        description="Samples posted to a scoring server over HTTP (plugrl's or OpenRLHF's schema)",
    )
