"""The built-in agent loops: ``single_turn`` (one prompt, one response: the default) and
``tool`` (turns of the model calling the run's tools)."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_agent_loops(register):
    register(
        "single_turn",
        "plugrl_agent_loops.single_turn:SingleTurnLoop",
        description="one response to the row's prompt (a run without agents)",
        aliases=["single_turn_agent"],
    )
    register(
        "tool",
        "plugrl_agent_loops.tool:ToolLoop",
        description="the model calls rollout.agent.tools between its turns",
        aliases=["tool_agent"],
    )
