"""What the agent tests share: a ChatML template that renders tools and tool results, a
scripted engine group, and tools that answer, refuse, fail or hang."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

import plugrl
from plugrl.config import option
from plugrl.parts.agent import (
    Environment,
    EnvironmentConfig,
    StepResult,
    Tool,
    ToolArgumentError,
    ToolConfig,
    ToolContext,
    ToolResult,
)
from plugrl.parts.rollout import Completion, GenerationRequest

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: "
    "{% for tool in tools %}{{ tool['function']['name'] }} {% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}"
    "{{ '<tool_call>' + call['function']['name'] + '</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with a system line naming the tools and ``tool`` turns: enough of what real
templates do for the tool loop's token bookkeeping."""


def tool_tokenizer() -> Any:
    from plugrl.testing import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


class ScriptedEngines:
    """An engine group whose turns answer with scripted texts (``script(request, turn)`` ->
    text), encoded by ``tokenizer``; every request is kept."""

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[GenerationRequest, int], str],
        version: int = 3,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.version = version
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        turn = int(request.request_id.rsplit("-t", 1)[1])
        self.requests.append(request)
        ids = self.tokenizer.encode(self.script(request, turn), add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        ids = [*ids, eos]
        limit = request.params.max_tokens
        reason = "stop" if len(ids) <= limit else "length"
        ids = ids[:limit]
        return [
            Completion(
                token_ids=ids,
                log_probs=[-0.5] * len(ids),
                finish_reason=reason,
                weight_version=self.version,
                request_id=request.request_id,
            )
        ]


@attrs.define(kw_only=True)
class EchoConfig(ToolConfig):
    prefix: str = option("echo:", "What each answer starts with.")


class EchoTool(Tool):
    """Answers its ``text`` argument (refusing a call without one), with reward 1; the text
    ``FAIL`` is answered as a failed call."""

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Repeat a text.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            },
        }

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        if "text" not in arguments:
            raise ToolArgumentError("echo needs a 'text' argument")
        text = arguments["text"]
        return ToolResult(text=f"{self.config.prefix}{text}", reward=1.0, error=text == "FAIL")


class BoomTool(Tool):
    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "boom", "parameters": {}}}

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise RuntimeError("it broke")


class SlowTool(Tool):
    """Sleeps ``seconds`` (default one hour); counts how many run at once."""

    running = 0
    most = 0

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "slow", "parameters": {}}}

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        type(self).running += 1
        type(self).most = max(type(self).most, type(self).running)
        try:
            await asyncio.sleep(float(arguments.get("seconds", 3600)))
        finally:
            type(self).running -= 1
        return "rested"


class AgentTestPlugin:
    """Registers the tools above."""

    @plugrl.hookimpl
    def register_tools(self, register):
        register("echo", f"{__name__}:EchoTool", config=f"{__name__}:EchoConfig")
        register("boom", f"{__name__}:BoomTool")
        register("slow", f"{__name__}:SlowTool")


def texts_of(tokenizer: Any, requests: Sequence[GenerationRequest]) -> list[str]:
    return [tokenizer.decode(list(r.prompt_ids)) for r in requests]


@attrs.define(kw_only=True)
class CountdownConfig(EnvironmentConfig):
    steps: int = option(2, "Steps to the end of an episode.")


class CountdownEnvironment(Environment):
    """Ends after ``steps`` steps, rewarding the last."""

    async def reset(self, row: Mapping[str, Any]) -> None:
        self.left = self.config.steps

    async def step(self, message: str) -> StepResult:
        self.left -= 1
        return StepResult(
            observation=f"{self.left} left", reward=float(not self.left), done=not self.left
        )


class AgentTestEnvironments:
    @plugrl.hookimpl
    def register_environments(self, register):
        register(
            "countdown", f"{__name__}:CountdownEnvironment", config=f"{__name__}:CountdownConfig"
        )
