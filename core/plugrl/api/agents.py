"""Multi-turn rollouts: environments, tools, tool-call parsers and agent loops, the session an
agent loop drives, and the process limits a tool that runs code starts under."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.agents import limits
    from plugrl.agents.images import TurnImages
    from plugrl.agents.turns import text_between_turns, tokens_between_turns
    from plugrl.parts.agent import (
        AGENT_NAME_COLUMN,
        FINISH_REASONS,
        AgentConfig,
        AgentLoop,
        AgentLoopConfig,
        Environment,
        EnvironmentConfig,
        Message,
        ParsedTurn,
        Session,
        StepResult,
        Tool,
        ToolArgumentError,
        ToolCall,
        ToolCallParser,
        ToolConfig,
        ToolContext,
        ToolResult,
        Trajectory,
    )

__all__ = [
    "AGENT_NAME_COLUMN",
    "FINISH_REASONS",
    "AgentConfig",
    "AgentLoop",
    "AgentLoopConfig",
    "Environment",
    "EnvironmentConfig",
    "Message",
    "ParsedTurn",
    "Session",
    "StepResult",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallParser",
    "ToolConfig",
    "ToolContext",
    "ToolResult",
    "Trajectory",
    "TurnImages",
    "limits",
    "text_between_turns",
    "tokens_between_turns",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "AGENT_NAME_COLUMN": ("plugrl.parts.agent", "AGENT_NAME_COLUMN"),
        "FINISH_REASONS": ("plugrl.parts.agent", "FINISH_REASONS"),
        "AgentConfig": ("plugrl.parts.agent", "AgentConfig"),
        "AgentLoop": ("plugrl.parts.agent", "AgentLoop"),
        "AgentLoopConfig": ("plugrl.parts.agent", "AgentLoopConfig"),
        "Environment": ("plugrl.parts.agent", "Environment"),
        "EnvironmentConfig": ("plugrl.parts.agent", "EnvironmentConfig"),
        "Message": ("plugrl.parts.agent", "Message"),
        "ParsedTurn": ("plugrl.parts.agent", "ParsedTurn"),
        "Session": ("plugrl.parts.agent", "Session"),
        "StepResult": ("plugrl.parts.agent", "StepResult"),
        "Tool": ("plugrl.parts.agent", "Tool"),
        "ToolArgumentError": ("plugrl.parts.agent", "ToolArgumentError"),
        "ToolCall": ("plugrl.parts.agent", "ToolCall"),
        "ToolCallParser": ("plugrl.parts.agent", "ToolCallParser"),
        "ToolConfig": ("plugrl.parts.agent", "ToolConfig"),
        "ToolContext": ("plugrl.parts.agent", "ToolContext"),
        "ToolResult": ("plugrl.parts.agent", "ToolResult"),
        "Trajectory": ("plugrl.parts.agent", "Trajectory"),
        "TurnImages": ("plugrl.agents.images", "TurnImages"),
        "limits": ("plugrl.agents", "limits"),
        "text_between_turns": ("plugrl.agents.turns", "text_between_turns"),
        "tokens_between_turns": ("plugrl.agents.turns", "tokens_between_turns"),
    },
)
