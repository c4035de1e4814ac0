"""The ``tool`` agent loop on the real session, a scripted engine and the tiny tokenizer with a
tool-aware ChatML template: token in, token out across turns, and each way a trajectory
ends."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from plugrl.agents.session import AgentRuntime
from plugrl.errors import RecipeError
from plugrl.parts.agent import AgentConfig, Tool, ToolArgumentError, ToolResult
from plugrl.parts.rollout import SamplingParams
from plugrl.testing import ScriptedSession, part_context, tool_call_text
from plugrl_agent_loops.tool import ToolLoop
from tests.core.agents.agent_support import AgentTestPlugin, ScriptedEngines, tool_tokenizer

PROMPT = [{"role": "user", "content": "Say hi."}]


def call(text):
    payload = json.dumps({"name": "echo", "arguments": {"text": text}})
    return f"<tool_call>{payload}</tool_call>"


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


@pytest.fixture
def run_tool_loop(plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin, tokenizer):
    """run_tool_loop(script, row=..., **agent) -> (trajectory, engines)."""
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    built = []

    def run(script, row=None, max_response_length=256, **agent):
        data = {key: agent.pop(key) for key in list(agent) if key.startswith("data.")}
        agent = {"loop": "tool", "tools": ["echo"], **agent}
        recipe = plugrl_recipe(
            {"rollout.agent": agent, "data.max_response_length": max_response_length, **data}
        )
        engines = ScriptedEngines(tokenizer, script)
        runtime = AgentRuntime(recipe, plugrl_plugin_manager, tokenizer, engines)
        built.append(runtime)
        row = row or {"uid": "u", "prompt": PROMPT, "raw_prompt_ids": [1]}
        params = SamplingParams(n=1, seed=3, max_tokens=max_response_length)
        [[[trajectory]]] = runtime.run([row], ["tool_agent"], params)
        return trajectory, engines

    yield run
    for runtime in built:
        runtime.close()


def test_tool_results_are_appended_unmasked_between_turns_kept_exactly_as_sampled(
    run_tool_loop, tokenizer
):
    trajectory, engines = run_tool_loop(lambda r, turn: call("hi") if turn == 0 else "It is hi.")
    first, second = engines.requests
    assert "Tools: echo" in tokenizer.decode(trajectory.prompt_ids)
    assert list(first.prompt_ids) == trajectory.prompt_ids
    eos = tokenizer.eos_token_id
    turn_one = [*tokenizer.encode(call("hi"), add_special_tokens=False), eos]
    turn_two = [*tokenizer.encode("It is hi.", add_special_tokens=False), eos]
    appended = trajectory.response_ids[len(turn_one) : len(trajectory.response_ids) - len(turn_two)]
    # the template's newline after the turn's <|im_end|> (sampled as eos), the tool's turn,
    # the next generation prompt
    assert tokenizer.decode(appended) == (
        "\n<|im_start|>tool\necho:hi<|im_end|>\n<|im_start|>assistant\n"
    )
    # the second turn continues the first's sampled tokens, not a re-rendering of them
    assert list(second.prompt_ids) == trajectory.prompt_ids + turn_one + appended
    assert trajectory.response_ids == turn_one + appended + turn_two
    assert trajectory.loss_mask == [1] * len(turn_one) + [0] * len(appended) + [1] * len(turn_two)
    assert trajectory.log_probs[len(turn_one) : len(turn_one) + len(appended)] == [0.0] * len(
        appended
    )
    assert trajectory.turn_ends == [len(turn_one) - 1, len(trajectory.response_ids) - 1]
    assert trajectory.turn_rewards == [1.0, 0.0]  # echo rewards the turn that called it
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 2)
    assert second.params.max_tokens == 256 - len(turn_one) - len(appended)
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1]["tool_calls"][0]["function"] == {
        "name": "echo",
        "arguments": {"text": "hi"},
    }
    assert trajectory.metrics["tool_calls"] == 1


def test_a_trajectory_that_keeps_calling_ends_at_max_turns_without_running_the_last_calls(
    run_tool_loop,
):
    trajectory, engines = run_tool_loop(lambda r, turn: call(str(turn)), max_turns=3)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("max_turns", 3)
    assert len(engines.requests) == 3
    assert trajectory.metrics["tool_calls"] == 2
    assert trajectory.loss_mask[-1] == 1  # it ends on the model's own tokens


def test_a_tool_result_past_the_budget_is_cut_to_it_and_ends_the_trajectory(
    run_tool_loop, tokenizer
):
    turn_one = len(tokenizer.encode(call("x"), add_special_tokens=False)) + 1
    budget = turn_one + 4
    trajectory, engines = run_tool_loop(
        lambda r, turn: call("x"),
        max_response_length=budget,
        tool_args={"echo": {"prefix": "a long answer " * 10}},
    )
    assert trajectory.finish_reason == "length"
    assert len(trajectory.response_ids) == budget
    assert trajectory.loss_mask[-4:] == [0, 0, 0, 0]
    assert len(engines.requests) == 1


def test_a_turn_cut_by_the_engine_ends_the_trajectory_with_length(run_tool_loop):
    trajectory, _ = run_tool_loop(lambda r, turn: "word " * 300)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("length", 1)
    assert len(trajectory.response_ids) == 256


def test_a_malformed_call_is_answered_with_an_error_and_the_model_goes_on(run_tool_loop, tokenizer):
    script = {0: "<tool_call>{not json</tool_call>", 1: "Sorry."}
    trajectory, _ = run_tool_loop(lambda r, turn: script[turn])
    assert trajectory.finish_reason == "stop"
    assert trajectory.messages[2]["content"].startswith("Error: the tool call could not be read")
    assert trajectory.metrics["tool_errors"] == 1
    assert trajectory.metrics["tool/invalid/errors"] == 1


def test_a_row_without_chat_messages_is_its_decoded_prompt(run_tool_loop, tokenizer):
    ids = tokenizer.encode("What is 2 + 2?", add_special_tokens=False)
    trajectory, _ = run_tool_loop(lambda r, turn: "4", row={"uid": "u", "raw_prompt_ids": ids})
    assert trajectory.messages[0] == {"role": "user", "content": "What is 2 + 2?"}


def test_a_prompt_the_tool_schemas_push_past_max_prompt_length_is_refused_in_one_line(
    run_tool_loop,
):
    with pytest.raises(RecipeError) as error:
        run_tool_loop(lambda r, turn: "4", **{"data.max_prompt_length": 8})
    assert re.fullmatch(
        r"data\.max_prompt_length: a prompt rendered with the tools' schemas is \d+ tokens, "
        r"over data\.max_prompt_length=8; raise data\.max_prompt_length by what the schemas add",
        str(error.value),
    )


def test_a_turn_cut_by_max_turn_tokens_is_closed_before_the_tool_results(run_tool_loop, tokenizer):
    head = call("hi")
    cap = len(tokenizer.encode(head, add_special_tokens=False))
    # the turn's eos is cut off: the loop appends the template's close of the turn itself
    trajectory, _ = run_tool_loop(
        lambda r, turn: head if turn == 0 else "ok", max_turn_tokens=cap, max_turns=2
    )
    appended = [
        t for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if m == 0
    ]
    assert tokenizer.decode(appended).startswith("<|im_end|>\n<|im_start|>tool\necho:hi")


# ---------------------------------------------------------------- a tool tested as its author would


class AddTool(Tool):
    """What a plugin author writes: adds two numbers, refuses anything else."""

    def schema(self):
        return {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
        }

    async def call(self, arguments, context):
        try:
            total = float(arguments["a"]) + float(arguments["b"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ToolArgumentError(f"add needs numbers a and b ({exc})") from None
        return ToolResult(text=f"{total:g}", metrics={"magnitude": abs(total)})


def play_tool_loop(tokenizer, replies, **session_options):
    session = ScriptedSession(
        tokenizer, replies, tools=[AddTool(None, part_context())], **session_options
    )
    loop = ToolLoop(None, part_context())
    row = {"uid": "u", "prompt": [{"role": "user", "content": "What is 1 + 2?"}]}
    return asyncio.run(loop.run(row, session)), session


@pytest.mark.parametrize("call_format", ["hermes", "llama3_json"])
def test_a_scripted_policy_calls_a_tool_through_the_tool_loop_and_reads_its_answer(
    tokenizer, call_format
):
    turn_one = tool_call_text("add", {"a": 1, "b": 2}, format=call_format)
    trajectory, session = play_tool_loop(
        tokenizer,
        [turn_one, "It is 3."],
        config=AgentConfig(tool_parser=call_format),
    )
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 1, "b": 2},
    }
    assert trajectory.messages[2]["content"] == "3"
    # the answer is in the tokens the model reads next, and never trained on
    appended = [
        t for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if m == 0
    ]
    assert tokenizer.decode(appended) == (
        "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    )
    turn_two_starts = max(i for i, m in enumerate(trajectory.loss_mask) if m == 0) + 1
    assert session.calls[1][0] == (
        trajectory.prompt_ids + trajectory.response_ids[:turn_two_starts]
    )
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 2)
    assert session.tool_metrics()["tool/add/calls"] == 1
    assert session.reported_metrics == [("add", "magnitude", 3.0)]


def test_a_scripted_call_with_bad_arguments_is_an_error_result_the_model_reads(tokenizer):
    trajectory, session = play_tool_loop(tokenizer, [tool_call_text("add", {"a": "one"}), "Sorry."])
    assert trajectory.messages[2]["content"].startswith("Error: bad arguments for tool 'add'")
    metrics = session.tool_metrics()
    assert (metrics["tool_errors"], metrics["tool/add/errors"]) == (1, 1)
