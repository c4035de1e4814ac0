"""The agent session: seeds per turn, tool calls and every way they fail, the run-wide limit
of tools in flight, and the runtime's checks of what agent loops return."""

from __future__ import annotations

import asyncio
import logging

import pytest

from plugrl.agents.session import AgentRuntime, AgentSession
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import AgentLoop, ToolCall, Trajectory
from plugrl.parts.rollout import SamplingParams, derive_seed
from plugrl.state.seeds import one_sample_request_seed

from .agent_support import (
    AgentTestEnvironments,
    AgentTestPlugin,
    CountdownEnvironment,
    ScriptedEngines,
    SlowTool,
    tool_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


@pytest.fixture
def runtime_of(plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin, tokenizer):
    """runtime_of(**agent options) -> an AgentRuntime on a scripted engine group."""
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    built = []

    def make(script=lambda request, turn: "done", **agent):
        recipe = plugrl_recipe({"rollout.agent": agent, "data.max_response_length": 64})
        engines = ScriptedEngines(tokenizer, script)
        runtime = AgentRuntime(recipe, plugrl_plugin_manager, tokenizer, engines)
        built.append(runtime)
        return runtime

    yield make
    for runtime in built:
        runtime.close()


def session_of(runtime, seed=11, prompt_index=0, sample_index=0):
    return AgentSession(
        runtime,
        sample_id=f"u{prompt_index}/{sample_index}",
        prompt_index=prompt_index,
        sample_index=sample_index,
        params=SamplingParams(n=4, seed=seed, max_tokens=64),
        request_prefix="agent1",
    )


def call_tools(runtime, session, calls):
    return runtime._thread.submit(session.call_tools(calls, {"uid": "u0"})).result()


def echo(text=None, index=0):
    arguments = {} if text is None else {"text": text}
    return ToolCall(id=f"call_{index}", name="echo", arguments=arguments, raw="{}")


def test_a_one_sample_request_draws_with_the_seed_its_sample_has_in_a_batched_request():
    request_seed = 987654321
    for sample in range(4):
        wanted = derive_seed(request_seed, sample)
        assert derive_seed(one_sample_request_seed(wanted), 0) == wanted


def test_turn_zero_samples_as_the_batched_path_and_later_turns_draw_seeds_of_their_own(
    runtime_of,
):
    runtime = runtime_of()
    session = session_of(runtime, seed=5, prompt_index=2, sample_index=3)
    batched = derive_seed(derive_seed(5, 2), 3)  # the engine group's, then the engine's
    assert derive_seed(session.turn_seed(0), 0) == batched
    assert derive_seed(session.turn_seed(1), 0) == derive_seed(5, 2, 3, 1)
    assert session.turn_seed(1) != session.turn_seed(2)
    assert session_of(runtime, seed=None).turn_seed(0) is None


def test_generate_sends_one_sample_with_the_turn_budget_and_counts_turns(runtime_of):
    runtime = runtime_of()
    session = session_of(runtime)
    for budget in (7, 3):
        runtime._thread.submit(session.generate([1, 2, 3], budget)).result()
    first, second = runtime.engines.requests
    assert (first.params.n, first.params.max_tokens) == (1, 7)
    assert second.params.max_tokens == 3
    assert (first.request_id, second.request_id) == ("agent1-0-0-t0", "agent1-0-0-t1")
    assert session.turn == 2


def test_a_tool_answers_and_its_reward_and_counts_are_kept(runtime_of):
    runtime = runtime_of(tools=["echo"], tool_args={"echo": {"prefix": ">"}})
    session = session_of(runtime)
    (result,) = call_tools(runtime, session, [echo("hi")])
    assert (result.text, result.error, result.reward) == (">hi", False, 1.0)
    assert session.last_tool_reward == 1.0
    metrics = session.counters.metrics()
    assert metrics["tool_calls"] == 1 and metrics["tool_errors"] == 0
    assert metrics["tool/echo/calls"] == 1 and metrics["tool/echo/latency_s"] >= 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            ToolCall(id="c", name="", arguments=None, raw="{oops", error="bad JSON: x"),
            "Error: the tool call could not be read (bad JSON: x).",
        ),
        (
            ToolCall(id="c", name="search", arguments={}, raw="{}"),
            "Error: unknown tool 'search'; the tools are: boom, echo, slow.",
        ),
        (echo(None), "Error: bad arguments for tool 'echo': echo needs a 'text' argument"),
        (
            ToolCall(id="c", name="boom", arguments={}, raw="{}"),
            "Error: tool 'boom' failed: RuntimeError: it broke",
        ),
        (
            ToolCall(id="c", name="slow", arguments={}, raw="{}"),
            "Error: tool 'slow' timed out after 0.05 s.",
        ),
    ],
    ids=["unreadable", "unknown", "bad-arguments", "raises", "times-out"],
)
def test_every_failed_call_is_an_error_the_model_reads_and_a_counted_error(
    runtime_of, call, message
):
    runtime = runtime_of(tools=["echo", "boom", "slow"], tool_timeout_s=0.05)
    session = session_of(runtime)
    (result,) = call_tools(runtime, session, [call])
    assert (result.text, result.error) == (message, True)
    metrics = session.counters.metrics()
    assert (metrics["tool_calls"], metrics["tool_errors"]) == (1, 1)
    name = call.name if call.name in runtime.tools else "invalid"
    assert metrics[f"tool/{name}/errors"] == 1


def test_a_tool_may_report_a_failure_it_explains_without_raising(runtime_of):
    runtime = runtime_of(tools=["echo"], tool_args={"echo": {"prefix": "no file "}})
    session = session_of(runtime)
    (result,) = call_tools(runtime, session, [echo("missing.txt", 0)])
    assert (result.text, result.error) == ("no file missing.txt", False)
    # the same tool, told to report the call as failed
    (result,) = call_tools(runtime, session, [echo("FAIL", 1)])
    assert (result.text, result.error) == ("no file FAIL", True)
    metrics = session.counters.metrics()
    assert (metrics["tool/echo/calls"], metrics["tool/echo/errors"]) == (2, 1)


def test_calls_past_max_parallel_calls_are_not_run_and_say_so(runtime_of):
    runtime = runtime_of(tools=["echo"], max_parallel_calls=2)
    session = session_of(runtime)
    results = call_tools(runtime, session, [echo(str(i), i) for i in range(3)])
    assert [(r.text, r.error) for r in results[:2]] == [("echo:0", False), ("echo:1", False)]
    assert results[2].text == (
        "Error: at most 2 tool calls are run per turn; call 'echo' was not run."
    )
    assert results[2].error
    assert session.counters.metrics()["tool_errors"] == 1


def test_max_tools_in_flight_bounds_the_calls_running_across_samples(runtime_of):
    runtime = runtime_of(tools=["slow"], max_tools_in_flight=2, max_parallel_calls=3)
    SlowTool.most = 0
    call = ToolCall(id="c", name="slow", arguments={"seconds": 0.02}, raw="{}")

    async def all_samples():
        sessions = [session_of(runtime, sample_index=i) for i in range(3)]
        return await asyncio.gather(*(s.call_tools([call] * 3, {}) for s in sessions))

    results = runtime._thread.submit(all_samples()).result()
    assert [[r.text for r in sample] for sample in results] == [["rested"] * 3] * 3
    assert SlowTool.most == 2


def test_a_long_result_is_cut_to_max_tool_response_length_tokens_and_marked(runtime_of, tokenizer):
    runtime = runtime_of(tools=["echo"], max_tool_response_length=5)
    session = session_of(runtime)
    (result,) = call_tools(runtime, session, [echo("the quick brown fox jumps " * 10)])
    text = result.text
    assert text.endswith("...(truncated)")
    kept = text.removesuffix("...(truncated)")
    assert len(tokenizer.encode(kept, add_special_tokens=False)) <= 5
    assert session.counters.metrics()["tool_truncated"] == 1


def test_options_of_a_tool_the_run_does_not_use_are_refused(plugrl_recipe, plugrl_register_plugin):
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    with pytest.raises(RecipeError) as error:
        plugrl_recipe({"rollout.agent": {"tools": ["boom"], "tool_args": {"echo": {}}}})
    assert str(error.value) == (
        "rollout.agent.tool_args.echo: options for tool 'echo', which rollout.agent.tools does "
        "not list (boom); add it there or drop its options"
    )


def test_a_tool_without_options_refuses_some(plugrl_recipe, plugrl_register_plugin):
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    with pytest.raises(RecipeError) as error:
        plugrl_recipe({"rollout.agent": {"tools": ["boom"], "tool_args": {"boom": {"x": 1}}}})
    assert str(error.value) == "rollout.agent.tool_args.boom: tool 'boom' takes no options, got x"


def test_a_bad_tool_option_names_its_key(plugrl_recipe, plugrl_register_plugin):
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    with pytest.raises(RecipeError, match=r"rollout\.agent\.tool_args\.echo"):
        plugrl_recipe({"rollout.agent": {"tools": ["echo"], "tool_args": {"echo": {"x": 1}}}})


def test_each_environment_asked_for_is_a_fresh_one_with_env_args(
    runtime_of, plugrl_register_plugin
):
    plugrl_register_plugin(AgentTestEnvironments(), "agent-test-envs")
    runtime = runtime_of(env="countdown", env_args={"steps": 1})
    session = session_of(runtime)
    first, second = session.make_environment(), session.make_environment()
    assert isinstance(first, CountdownEnvironment) and first is not second
    assert first.config.steps == 1

    async def episode():
        await first.reset({})
        return await first.step("go")

    result = runtime._thread.submit(episode()).result()
    assert (result.observation, result.reward, result.done) == ("0 left", 1.0, True)


def test_an_environment_asked_for_when_none_is_set_says_how_to_set_one(runtime_of):
    runtime = runtime_of()
    with pytest.raises(RecipeError) as error:
        session_of(runtime).make_environment()
    assert str(error.value) == (
        "rollout.agent.env: no environment is set; set rollout.agent.env to a registered "
        "environment (plugrl list environments)"
    )


class _Broken(AgentLoop):
    result: object = None

    async def run(self, row, session):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            KeyError("prompt"),
            "agent loop 'single_turn' failed on sample u/0: KeyError: 'prompt'; fix the loop "
            "(tool and environment errors are the model's to read, a loop's own are not)",
        ),
        (
            [],
            "agent loop 'single_turn' returned no trajectory for sample u/0; return a "
            "Trajectory or a non-empty list of them",
        ),
        (
            ["text"],
            "agent loop 'single_turn' returned str for sample u/0; return "
            "plugrl.parts.agent.Trajectory objects",
        ),
        (
            Trajectory(prompt_ids=[1], response_ids=[1], loss_mask=[], log_probs=[1.0]),
            "agent loop 'single_turn', sample u/0: a trajectory's response_ids, loss_mask, "
            "log_probs and token_versions differ in length (1, 0, 1, 0)",
        ),
        (
            Trajectory(
                prompt_ids=[1],
                response_ids=[5] * 65,
                loss_mask=[1] * 65,
                log_probs=[0.0] * 65,
                token_versions=[0] * 65,
            ),
            "agent loop 'single_turn' returned a response of 65 tokens for sample u/0, over "
            "data.max_response_length=64; cut appended tokens to what is left",
        ),
    ],
    ids=["raises", "empty", "not-a-trajectory", "ragged", "too-long"],
)
def test_what_a_loop_returns_is_checked_with_one_line_naming_the_loop(runtime_of, result, message):
    runtime = runtime_of()
    loop = _Broken(None, None)
    loop.result = result
    runtime._loops["single_turn"] = loop
    params = SamplingParams(n=1, seed=0, max_tokens=64)
    with pytest.raises(PluginError) as error:
        runtime.run([{"uid": "u", "raw_prompt_ids": [1]}], ["single_turn"], params)
    assert str(error.value) == message


def _verl_tool_file(tmp_path, name):
    import yaml

    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": "Guess the answer.",
            "parameters": {"type": "object", "properties": {"guess": {"type": "string"}}},
        },
    }
    entry = {
        "class_name": "tests.core.agents.verl_style_tools.GuessTool",
        "config": {"type": "native"},
        "tool_schema": schema,
    }
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [entry]}), encoding="utf-8")
    return path


def test_the_tools_of_a_verl_tool_file_are_offered_and_called_beside_registered_ones(
    runtime_of, tmp_path
):
    path = _verl_tool_file(tmp_path, "guess")
    runtime = runtime_of(tools=["echo"], tool_config_path=str(path))
    session = session_of(runtime)
    assert {s["function"]["name"] for s in session.tool_schemas()} >= {"echo", "guess"}
    row = {"uid": "u0", "extra_info": {"tools_kwargs": {"guess": {"create_kwargs": {}}}}}
    call = ToolCall(id="c", name="guess", arguments={"guess": "7"}, raw="{}")
    (answer,) = runtime._thread.submit(session.call_tools([call], row)).result()
    assert (answer.text, answer.error) == ("wrong", False)
    assert session.counters.metrics()["tool/guess/calls"] == 1


def test_a_verl_tool_named_as_a_registered_tool_is_refused(runtime_of, tmp_path):
    path = _verl_tool_file(tmp_path, "echo")
    with pytest.raises(RecipeError, match=r"the tool 'echo' of .* has the name of a tool of"):
        runtime_of(tools=["echo"], tool_config_path=str(path))


def test_closing_the_runtime_closes_the_agent_loops_it_built(runtime_of):
    closed = []

    class Closing(AgentLoop):
        async def run(self, row, session):
            raise AssertionError("not run")

        def close(self):
            closed.append(self)

    runtime = runtime_of()
    runtime._loops["closing"] = Closing(None, None)
    runtime.close()
    assert len(closed) == 1


def test_max_turn_tokens_caps_a_turn_and_a_turn_cut_there_is_read_as_ended(runtime_of):
    runtime = runtime_of(script=lambda request, turn: "a long answer " * 8, max_turn_tokens=4)
    session = session_of(runtime)
    capped = runtime._thread.submit(session.generate([1, 2, 3], 64)).result()
    # the trajectory's budget is smaller than the cap: it binds, and its end is a length end
    last = runtime._thread.submit(session.generate([1, 2, 3], 2)).result()
    first, second = runtime.engines.requests
    assert (first.params.max_tokens, second.params.max_tokens) == (4, 2)
    assert (len(capped.token_ids), capped.finish_reason) == (4, "stop")
    assert (len(last.token_ids), last.finish_reason) == (2, "length")


def test_a_parser_that_raises_gives_a_failed_call_not_an_exception(runtime_of, caplog):
    runtime = runtime_of(tools=["echo"])

    def broken_parser(text):
        raise RecursionError("maximum recursion depth exceeded")

    runtime.parser = broken_parser
    session = session_of(runtime)
    with caplog.at_level("WARNING", logger="plugrl.agents"):
        first = session.parse_tool_calls('<tool_call>{"name": "echo"}</tool_call>')
        session.parse_tool_calls("again")
    (call,) = first.tool_calls
    assert call.arguments is None and "RecursionError" in call.error
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "raised on a model turn" in warnings[0].getMessage()
    assert runtime.parser_failures == 2


def test_a_tool_that_raises_is_logged_with_its_traceback_once_then_counted_per_step(
    runtime_of, caplog
):
    # the drill: a tool whose own code raised left only a metric, no console line
    runtime = runtime_of(tools=["echo", "boom"])
    session = session_of(runtime)
    boom = ToolCall(id="c", name="boom", arguments={}, raw="{}")
    with caplog.at_level(logging.WARNING, logger="plugrl.agents"):
        for _ in range(3):
            call_tools(runtime, session, [boom, echo("hi")])
        first = [r for r in caplog.records if "bug in the tool" in r.getMessage()]
        assert len(first) == 1 and first[0].exc_info is not None
        assert first[0].getMessage().startswith("tool 'boom' raised RuntimeError: it broke;")
        assert "raise RuntimeError" in caplog.text  # the traceback
        metrics = runtime.take_tool_metrics()
    assert metrics["agent/tool/boom/raised"] == 3.0
    assert "tool 'boom' raised 3 times this step; first: RuntimeError: it broke" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="plugrl.agents"):
        call_tools(runtime, session, [boom])
        assert "agent/tool/boom/raised" in runtime.take_tool_metrics()
    # after the first, no traceback again: one count a step
    assert "bug in the tool" not in caplog.text
    assert "raised 1 times this step" in caplog.text
