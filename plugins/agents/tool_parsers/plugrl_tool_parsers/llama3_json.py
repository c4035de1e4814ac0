"""The ``llama3_json`` format: Llama 3.1 and 3.2 call a tool by answering with bare JSON,
``{"name": ..., "parameters": {...}}`` (some write ``arguments``), after an optional
``<|python_tag|>``; several calls in one turn are separated by ``;``."""

from __future__ import annotations

import json

from plugrl.api.agents import ParsedTurn, ToolCall
from plugrl_tool_parsers.hermes import read_payload
from plugrl_tool_parsers.json_reading import decode_json_at

PYTHON_TAG = "<|python_tag|>"
# the end-of-turn tokens, present when the text was decoded with its special tokens
_TURN_ENDS = ("<|eom_id|>", "<|eot_id|>")
_ARGUMENT_KEYS = ("parameters", "arguments")


def parse_llama3_json(text: str) -> ParsedTurn:
    """The calls of a turn that is JSON (after an optional ``<|python_tag|>``); any other turn
    is content with no calls. Text before the tag is the content."""
    content, tag, calls_text = text.partition(PYTHON_TAG)
    if not tag:
        content, calls_text = "", text
    calls_text = calls_text.strip()
    for end in _TURN_ENDS:
        calls_text = calls_text.removesuffix(end).rstrip()
    if not calls_text.startswith("{"):
        if not tag:
            return ParsedTurn(content=text)
        error = (
            'expected JSON calls {"name": ..., "parameters": {...}} after <|python_tag|>, '
            f"got {calls_text[:40]!r}"
        )
        call = ToolCall(id="call_0", name="", arguments=None, raw=calls_text, error=error)
        return ParsedTurn(content=content.strip(), tool_calls=[call])
    return ParsedTurn(content=content.strip(), tool_calls=_read_calls(calls_text))


def _read_calls(text: str) -> list[ToolCall]:
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while position < len(text):
        payload, end, error = decode_json_at(decoder, text, position)
        if error is not None:
            raw = text[position:]
            calls.append(
                ToolCall(
                    id=f"call_{len(calls)}",
                    name="",
                    arguments=None,
                    raw=raw,
                    error=error,
                )
            )
            break
        calls.append(read_payload(payload, text[position:end], len(calls), _ARGUMENT_KEYS))
        position = end
        # the separator between calls: ';' and whitespace
        while position < len(text) and (text[position].isspace() or text[position] == ";"):
            position += 1
    return calls
