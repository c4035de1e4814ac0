"""The llama3_json and gpt-oss parsers: each format as its chat template renders it, and
malformed calls that become ToolCall.error, never an exception."""

from __future__ import annotations

import pytest

from plugrl_tool_parsers.gpt_oss import parse_gpt_oss
from plugrl_tool_parsers.llama3_json import parse_llama3_json

# --------------------------------------------------------------------------------- llama3_json


def test_llama3_a_call_as_the_template_renders_it():
    # Llama 3.1's template writes an assistant's call as bare JSON ending the turn
    turn = parse_llama3_json('{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>')
    (call,) = turn.tool_calls
    assert (call.name, call.arguments, call.error) == ("get_weather", {"city": "Paris"}, None)
    assert turn.content == ""


def test_llama3_python_tag_arguments_key_and_several_calls():
    text = (
        "Let me check both.<|python_tag|>"
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "2"}}<|eom_id|>'
    )
    turn = parse_llama3_json(text)
    assert turn.content == "Let me check both."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_0", "a", {"x": 1}),
        ("call_1", "b", {"y": "2"}),
    ]
    assert turn.tool_calls[0].raw == '{"name": "a", "parameters": {"x": 1}}'


def test_llama3_a_plain_answer_has_no_calls():
    turn = parse_llama3_json("The answer is 42.")
    assert turn.content == "The answer is 42." and turn.tool_calls == ()


def test_llama3_arguments_as_a_json_string_are_read():
    (call,) = parse_llama3_json('{"name": "f", "parameters": "{\\"a\\": 1}"}').tool_calls
    assert call.arguments == {"a": 1}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "f", "parameters": {"a": 1}', "bad JSON: Expecting ',' delimiter"),
        ('{"parameters": {"a": 1}}', 'a call must be a JSON object with a string "name"'),
        ('{"name": "f", "parameters": [1, 2]}', '"parameters" must be a JSON object'),
        ("<|python_tag|>brave_search.call(query='x')", "expected JSON calls"),
    ],
)
def test_llama3_malformed_calls_carry_an_error(text, error):
    (call,) = parse_llama3_json(text).tool_calls
    assert call.arguments is None
    assert call.error.startswith(error)


def test_llama3_a_good_call_then_a_broken_one():
    calls = parse_llama3_json('{"name": "a", "parameters": {}}; {"name": "b", "par').tool_calls
    assert [c.name for c in calls] == ["a", ""]
    assert calls[0].error is None and calls[1].error.startswith("bad JSON")
    assert calls[1].raw == '{"name": "b", "par'


# --------------------------------------------------------------------------------- gpt-oss

ANALYSIS = "<|channel|>analysis<|message|>Need the weather; call get_weather.<|end|>"


def test_gpt_oss_a_call_as_the_cookbook_writes_it():
    text = (
        ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"location":"San Francisco"}<|call|>'
    )
    turn = parse_gpt_oss(text)
    (call,) = turn.tool_calls
    assert (call.name, call.arguments, call.error) == (
        "get_weather",
        {"location": "San Francisco"},
        None,
    )
    assert turn.content == ""  # the chain of thought is not content


def test_gpt_oss_the_recipient_before_the_channel_as_the_chat_template_renders_it():
    # gpt-oss's template writes a call so; the generation prompt is "<|start|>assistant", so
    # a first message's header starts right after it
    call_text = ' to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}<|call|>'
    for text in (call_text, ANALYSIS + "<|start|>assistant" + call_text):
        (call,) = parse_gpt_oss(text).tool_calls
        assert (call.name, call.arguments) == ("lookup", {"q": 1})


def test_gpt_oss_a_tools_answer_in_the_text_is_not_a_call():
    answer = '<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>"20 C"<|end|>'
    assert parse_gpt_oss(ANALYSIS + answer).tool_calls == ()


def test_gpt_oss_a_call_whose_stop_token_was_dropped_and_a_final_answer():
    calls = parse_gpt_oss(
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 2}'
    ).tool_calls
    assert calls[0].arguments == {"a": 2}
    turn = parse_gpt_oss(
        ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is 20 C.<|return|>"
    )
    assert turn.content == "It is 20 C." and turn.tool_calls == ()


def test_gpt_oss_the_python_recipient_calls_the_python_tool_with_its_code():
    (call,) = parse_gpt_oss(
        "<|channel|>analysis to=python code<|message|>print(1+1)<|call|>"
    ).tool_calls
    assert (call.name, call.arguments) == ("python", {"code": "print(1+1)"})


def test_gpt_oss_text_without_harmony_markup_is_content():
    assert parse_gpt_oss("just text").content == "just text"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{bad}<|call|>",
            "bad JSON: Expecting property name enclosed in double quotes",
        ),
        (
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1]<|call|>",
            "the arguments must be a JSON object",
        ),
        (
            "<|channel|>commentary to=functions.f <|constrain|>json",
            "the call of functions.f has no <|message|> with its arguments",
        ),
        (
            "<|channel|>commentary to=browser.search<|message|>{}<|call|>",
            "unknown recipient 'browser.search': call a tool as to=functions.NAME",
        ),
    ],
)
def test_gpt_oss_malformed_calls_carry_an_error(text, error):
    (call,) = parse_gpt_oss(text).tool_calls
    assert call.arguments is None
    assert call.error.startswith(error)


def test_the_parsers_are_registered(plugrl_plugin_manager):
    parsers = plugrl_plugin_manager.registry("tool_parsers")
    assert parsers.get("llama3_json").load() is parse_llama3_json
    assert parsers.get("gpt-oss").load() is parse_gpt_oss
