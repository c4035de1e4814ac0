"""A tool call nested deeper than Python's recursion limit is a failed call the model is told
about, never an exception that ends the run (the fourth drill: ~1,000 levels, a few hundred
tokens, raised RecursionError from all three parsers)."""

from __future__ import annotations

import pytest

from plugrl_tool_parsers.gpt_oss import parse_gpt_oss
from plugrl_tool_parsers.hermes import parse_hermes
from plugrl_tool_parsers.json_reading import MAX_DEPTH
from plugrl_tool_parsers.llama3_json import parse_llama3_json


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_call_texts(depth: int) -> dict[str, tuple[object, str]]:
    arguments = '{"x": ' + nested(depth) + "}"
    return {
        "hermes": (
            parse_hermes,
            f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>',
        ),
        "hermes arguments as a string": (
            parse_hermes,
            '<tool_call>{"name": "f", "arguments": "'
            + arguments.replace('"', '\\"')
            + '"}</tool_call>',
        ),
        "hermes bare": (parse_hermes, f"<tool_call>{nested(depth)}</tool_call>"),
        "llama3_json": (parse_llama3_json, f'{{"name": "f", "parameters": {arguments}}}'),
        "llama3_json tagged": (parse_llama3_json, f'<|python_tag|>{{"a": {nested(depth)}}}'),
        "gpt-oss": (
            parse_gpt_oss,
            f"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{arguments}<|call|>",
        ),
    }


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("form", list(deep_call_texts(1)))
def test_deeply_nested_call_is_a_failed_call_not_an_exception(form, depth):
    parse, text = deep_call_texts(depth)[form]
    turn = parse(text)
    assert len(turn.tool_calls) == 1
    (call,) = turn.tool_calls
    assert call.arguments is None
    assert "nested deeper than" in call.error


@pytest.mark.parametrize("form", list(deep_call_texts(1)))
def test_nesting_within_the_limit_is_read(form):
    parse, text = deep_call_texts(MAX_DEPTH - 3)[form]
    (call,) = parse(text).tool_calls
    if form.endswith("bare") or form.endswith("tagged"):
        assert call.error == 'a call must be a JSON object with a string "name"'
    else:
        assert call.error is None, call.error
        assert call.name == "f"


def test_a_number_past_the_digit_limit_is_bad_json():
    (call,) = parse_hermes(
        '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>"
    ).tool_calls
    assert call.arguments is None and call.error.startswith("bad JSON")
