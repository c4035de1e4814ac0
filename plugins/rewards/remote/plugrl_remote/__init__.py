"""The ``remote`` reward manager: responses scored by an HTTP server (a sandbox farm, a reward
model behind an API, ``plugrl serve reward``, an OpenRLHF remote reward server).

Registered by path, so nothing here imports httpx or torch until a run chooses it.
"""

from __future__ import annotations

import plugrl

_MANAGER = "plugrl_remote.manager"


@plugrl.hookimpl
def register_reward_managers(register):
    register(
        "remote",
        f"{_MANAGER}:RemoteRewardManager",
        config=f"{_MANAGER}:RemoteRewardConfig",
        description="Samples posted to a scoring server over HTTP (plugrl's or OpenRLHF's schema)",
    )
