"""Multi-turn rollouts: environments, tools, tool-call parsers and agent loops, the session an
agent loop drives, and the process limits a tool that runs code starts under."""

from plugrl.agents import limits
from plugrl.agents.turns import tokens_between_turns
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
    "limits",
    "tokens_between_turns",
]
