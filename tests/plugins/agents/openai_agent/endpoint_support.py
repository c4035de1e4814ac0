"""A scripted session and a chat template with tools, for the endpoint's tests: the engines'
answers are texts given in advance, sampled as the tiny tokenizer's ids plus the end-of-turn
token, with made-up log-probs that tell the turns apart."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.parts.agent import (
    AgentConfig,
    Environment,
    ParsedTurn,
    Session,
    ToolCall,
)
from plugrl.parts.rollout import Completion

# ChatML with tools in the system turn and each tool call as indented JSON between
# <tool_call> tags: a model that writes its calls compactly is re-rendered differently
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for tool in tools %}\n{{ tool | tojson }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>\\n' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def make_tokenizer() -> Any:
    from plugrl.testing.tiny import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


class ScriptedSession(Session):
    """Answers each ``generate`` with the next of ``answers`` (a text, ended with the eos
    token unless it is cut at ``max_tokens``), after ``delay_s``; records every call's
    ``(token_ids, max_tokens)`` in ``calls``. ``fail`` makes ``generate`` raise; ``spelled``
    samples each character as a token of its own."""

    def __init__(
        self,
        tokenizer: Any,
        answers: Sequence[str],
        *,
        sample_id: str = "uid0/0",
        max_response_length: int = 256,
        max_turns: int = 5,
        delay_s: float = 0.0,
        weight_version: int = 3,
        fail: bool = False,
        spelled: bool = False,
    ) -> None:
        self.sample_id = sample_id
        self.tokenizer = tokenizer
        self.config = AgentConfig(max_turns=max_turns)
        self.max_response_length = max_response_length
        self.answers = list(answers)
        self.calls: list[tuple[list[int], int]] = []
        self.delay_s = delay_s
        self.weight_version = weight_version
        self.fail = fail
        self.spelled = spelled

    async def generate(self, token_ids: Sequence[int], max_tokens: int) -> Completion:
        self.calls.append((list(token_ids), max_tokens))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("engine 0 is gone")
        turn = len(self.calls)
        text = self.answers.pop(0)
        # spelled: one token per character, as a sampler may well produce, where the
        # tokenizer would merge them
        tokens = [i for c in text for i in self.tokenizer.encode(c)] if self.spelled else None
        ids = [*(tokens or self.tokenizer.encode(text)), self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        return Completion(
            token_ids=ids,
            log_probs=[-0.01 * turn - 0.001 * i for i in range(len(ids))],
            finish_reason=finish,
            weight_version=self.weight_version,
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        from plugrl_tool_parsers.hermes import parse_hermes

        return parse_hermes(text)

    async def call_tools(self, calls: Sequence[ToolCall], row: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError("the endpoint never runs tools: the agent does")

    def make_environment(self) -> Environment:
        raise NotImplementedError("the endpoint has no environment")
