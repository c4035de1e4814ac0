"""Tools written in verl's style (create / execute / calc_reward / release), without verl, for
the tests of plugrl.agents.verl_tools."""

from __future__ import annotations

import asyncio
from typing import Any


class Response:
    """Like verl's ToolResponse: a text (and images or videos, left out here)."""

    def __init__(self, text: str) -> None:
        self.text = text


class GuessTool:
    """Tells whether a guess is the row's answer; rewards a right guess."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name  # verl's classes read the schema by attribute
        self.instances: dict[str, dict[str, Any]] = {}
        self.created = 0
        self.released: list[str] = []

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        await asyncio.sleep(0)  # parallel calls must not create twice meanwhile
        self.created += 1
        instance_id = instance_id or f"instance-{self.created}"
        truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self.instances[instance_id] = {"truth": truth, "guesses": 0, "right": False}
        return instance_id, Response("")

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Response, float, dict]:
        state = self.instances[instance_id]
        state["guesses"] += 1
        right = str(parameters["guess"]) == str(state["truth"])
        state["right"] = state["right"] or right
        word = "right" if right else "wrong"
        return (
            Response(f"{word}{kwargs.get('suffix', '')}"),
            float(right),
            {
                "guesses": state["guesses"],
                "label": "not a number",
            },
        )

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 1.0 if self.instances[instance_id]["right"] else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released.append(instance_id)
        del self.instances[instance_id]


class SelfDescribedTool(GuessTool):
    """Gives its own schema when the YAML has none, as a plain mapping."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        self.config = config
        self.instances = {}
        self.created = 0
        self.released = []

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": "echo", "description": "Echo.", "parameters": {}},
        }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> str:
        return f"echo {parameters.get('text', '')}"


class BrokenTool:
    def __init__(self, config: dict, tool_schema: Any) -> None:
        raise KeyError("api_key")


class FlakyCreateTool(GuessTool):
    """Its first create fails (a service not up yet)."""

    attempts = 0

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        self.attempts += 1
        if self.attempts == 1:
            raise ConnectionError("service not ready")
        return await super().create(instance_id, **kwargs)
