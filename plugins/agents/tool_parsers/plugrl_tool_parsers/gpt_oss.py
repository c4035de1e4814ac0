"""The ``gpt-oss`` format (OpenAI's harmony, verl's name): a turn is a run of messages, each
``<|channel|>CHANNEL<|message|>BODY`` ended by ``<|end|>``, ``<|call|>`` or ``<|return|>``, the
ones after the first opened by ``<|start|>assistant``. A message addressed to a function is a
call: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
(the recipient may also stand before the channel). The text must be decoded with its special
tokens.

The content is the ``final`` channel's text; the ``analysis`` channel (the chain of thought)
is dropped. A message to the built-in ``python`` recipient is a call of the ``python`` tool
with the body as its ``code``.
"""

from __future__ import annotations

import re

from plugrl.api.agents import ParsedTurn, ToolCall
from plugrl_tool_parsers.json_reading import load_json

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_ENDS = ("<|call|>", "<|end|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
FUNCTIONS = "functions."


def parse_gpt_oss(text: str) -> ParsedTurn:
    """The ``final`` text and the calls of a harmony turn; text without harmony markup is all
    content."""
    if CHANNEL not in text and MESSAGE not in text:
        return ParsedTurn(content=text)
    finals: list[str] = []
    calls: list[ToolCall] = []
    for index, segment in enumerate(text.split(START)):
        if not segment.strip():
            continue
        header, marker, rest = segment.partition(MESSAGE)
        has_body = bool(marker)
        if index > 0:
            if not header.startswith("assistant"):
                continue  # another author's message (a tool's answer) is not the model's
            header = header.removeprefix("assistant")
        # a message without its end token stopped on it (a stop token the engine dropped)
        cuts = [cut for cut in (rest.find(end) for end in _ENDS) if cut >= 0]
        body = rest[: min(cuts)] if cuts else rest
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None:
            calls.append(_read_call(recipient.group(1), body, segment, has_body, len(calls)))
        elif channel is not None and channel.group(1) == "final" and has_body:
            finals.append(body)
    return ParsedTurn(content="".join(finals).strip(), tool_calls=calls)


def _read_call(recipient: str, body: str, raw: str, has_body: bool, index: int) -> ToolCall:
    call_id = f"call_{index}"
    name = recipient.removeprefix(FUNCTIONS)
    if not has_body:
        error = f"the call of {recipient} has no <|message|> with its arguments"
        return ToolCall(id=call_id, name=name, arguments=None, raw=raw, error=error)
    if recipient == "python":
        return ToolCall(id=call_id, name="python", arguments={"code": body}, raw=raw)
    if not recipient.startswith(FUNCTIONS):
        error = f"unknown recipient {recipient!r}: call a tool as to=functions.NAME"
        return ToolCall(id=call_id, name=name, arguments=None, raw=raw, error=error)
    arguments, error = load_json(body) if body.strip() else ({}, None)
    if error is not None:
        return ToolCall(id=call_id, name=name, arguments=None, raw=raw, error=error)
    if not isinstance(arguments, dict):
        error = "the arguments must be a JSON object"
        return ToolCall(id=call_id, name=name, arguments=None, raw=raw, error=error)
    return ToolCall(id=call_id, name=name, arguments=arguments, raw=raw)
