"""The ``skypilot`` launcher: a SkyPilot task whose nodes start Ray, the first of them the
head, which then runs the recipe (docs/cluster.md, "Launching a job")."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_launchers(register):
    register(
        "skypilot",
        "plugrl_skypilot.launcher:SkyPilotLauncher",
        config="plugrl_skypilot.launcher:SkyPilotConfig",
    )
