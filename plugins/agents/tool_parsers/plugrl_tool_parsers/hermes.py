"""The ``hermes`` format: each call is a JSON object ``{"name": ..., "arguments": {...}}``
between ``<tool_call>`` and ``</tool_call>``, as Qwen2.5's and Qwen3's chat templates teach."""

from __future__ import annotations

import re
from typing import Any

from plugrl.api.agents import ParsedTurn, ToolCall
from plugrl_tool_parsers.json_reading import load_json

# an unclosed tag at the end of a turn is still a call (the turn may have stopped on the
# closing tag as a stop string, or run out of tokens inside it)
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def read_call(raw: str, index: int, arguments_key: str = "arguments") -> ToolCall:
    """One call from its JSON text; a call that cannot be read carries ``error``."""
    payload, error = load_json(raw)
    if error is not None:
        return ToolCall(id=f"call_{index}", name="", arguments=None, raw=raw, error=error)
    return read_payload(payload, raw, index, (arguments_key,))


def read_payload(
    payload: Any, raw: str, index: int, arguments_keys: tuple[str, ...] = ("arguments",)
) -> ToolCall:
    """One call from its decoded JSON ``payload``: an object with a string ``name`` and its
    arguments under the first of ``arguments_keys`` present (none: no arguments)."""
    call_id = f"call_{index}"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall(
            id=call_id,
            name="",
            arguments=None,
            raw=raw,
            error='a call must be a JSON object with a string "name"',
        )
    arguments_key = next((key for key in arguments_keys if key in payload), arguments_keys[0])
    arguments = payload.get(arguments_key, {})
    if isinstance(arguments, str):
        # some models write the arguments as a JSON string, as OpenAI's API carries them
        arguments, error = load_json(arguments)
        if error is not None:
            error = f"{error} (in {arguments_key})"
            return ToolCall(id=call_id, name=payload["name"], arguments=None, raw=raw, error=error)
    if not isinstance(arguments, dict):
        return ToolCall(
            id=call_id,
            name=payload["name"],
            arguments=None,
            raw=raw,
            error=f'"{arguments_key}" must be a JSON object',
        )
    return ToolCall(id=call_id, name=payload["name"], arguments=arguments, raw=raw)


def parse_hermes(text: str) -> ParsedTurn:
    """The text before the first ``<tool_call>`` and the calls."""
    calls = [read_call(match.group(1).strip(), i) for i, match in enumerate(_CALL.finditer(text))]
    content = text.split("<tool_call>", 1)[0].strip() if calls else text
    return ParsedTurn(content=content, tool_calls=calls)
