"""The built-in agent loops: ``single_turn`` (one prompt, one response: the default),
``tool`` (turns of the model calling the run's tools) and ``env`` (an environment answers
each turn)."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
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
    register(
        "env",
        "plugrl_agent_loops.env:EnvLoop",
        description="turns driven by an environment (rollout.agent.env): observations and rewards",
    )
