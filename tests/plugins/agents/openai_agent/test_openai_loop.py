"""The ``openai`` agent loop: a user's agent function, run per sample against the run's
endpoint through the real ``openai`` client, and the trajectories and reward it leaves."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from plugrl.errors import RecipeError
from plugrl.recipe import build_recipe
from plugrl.testing import make_recipe, part_context
from tests.plugins.agents.openai_agent.endpoint_support import ScriptedSession, make_tokenizer

from . import agents

openai = pytest.importorskip("openai")

from plugrl_openai_agent.loop import MAX_WARNINGS, OpenAILoop, OpenAILoopConfig  # noqa: E402

AGENTS = "tests.plugins.agents.openai_agent.agents"
CALL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def row_for(tokenizer: Any) -> dict[str, Any]:
    prompt = [{"role": "user", "content": "What is 1 + 2?"}]
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return {
        "prompt": prompt,
        "raw_prompt_ids": tokenizer.encode(text),
        "reward_model": {"ground_truth": "3"},
    }


def run_agent(name: str, session: ScriptedSession, **options: Any) -> list[Any]:
    """The trajectories ``agents.<name>`` leaves for one sample; the loop closed after."""
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{AGENTS}:{name}", **options), part_context())
    try:
        return asyncio.run(loop.run(row_for(session.tokenizer), session))
    finally:
        loop.close()


def test_a_tool_using_agent_is_one_trajectory_with_its_reward(tokenizer):
    session = ScriptedSession(tokenizer, [CALL_TEXT, "1 + 2 = 3"])
    [trajectory] = run_agent("solve", session)
    trajectory.check()
    assert trajectory.reward == 1.0
    assert trajectory.num_turns == 2
    assert trajectory.finish_reason == "stop"
    assert trajectory.prompt_ids == session.calls[0][0]
    assert trajectory.loss_mask.count(0) > 0 and trajectory.loss_mask[-1] == 1
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.metrics == {
        "endpoint_calls": 2.0,
        "endpoint_limited_calls": 0.0,
        "endpoint_sequences": 1.0,
        "endpoint_substituted_prompts": 1.0,  # the call re-rendered with newlines
        "endpoint_malformed_tool_calls": 0.0,
        "agent_errors": 0.0,
    }


def test_unrelated_calls_are_sequences_and_none_leaves_the_reward_to_the_manager(tokenizer):
    session = ScriptedSession(tokenizer, ["3", "Sure."])
    first, second = run_agent("two_questions", session)
    assert tokenizer.decode(first.response_ids) == "3<|im_end|>"
    assert tokenizer.decode(second.response_ids) == "Sure.<|im_end|>"
    assert first.reward is None and second.reward is None
    assert second.metrics["endpoint_sequences"] == 2.0 and first.metrics == {}


def test_a_plain_function_gets_a_blocking_client_and_the_agent_args(tokenizer):
    session = ScriptedSession(tokenizer, ["3"])
    [trajectory] = run_agent("blocking", session, agent_args={"greeting": "Hey"})
    assert trajectory.reward == 1.0
    assert trajectory.messages[0] == {"role": "user", "content": "Hey! What is 1 + 2?"}


def test_an_agent_with_kwargs_gets_every_provided_argument(tokenizer):
    session = ScriptedSession(tokenizer, ["3"], sample_id="u7/1")
    agents.SEEN.clear()
    run_agent("takes_everything", session, model_name="policy")
    [seen] = agents.SEEN
    assert sorted(seen) == ["api_key", "base_url", "client", "model", "sample_id"]
    assert seen["model"] == "policy" and seen["sample_id"] == "u7/1"
    assert seen["base_url"].endswith("/samples/u7/1/v1")
    assert isinstance(seen["client"], openai.AsyncOpenAI)


def test_an_agent_object_with_an_async_call_gets_a_copy_of_the_row(tokenizer):
    session = ScriptedSession(tokenizer, ["3"])
    row = row_for(tokenizer)
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{AGENTS}:solver"), part_context())
    try:
        [trajectory] = asyncio.run(loop.run(row, session))
    finally:
        loop.close()
    assert trajectory.reward == 1.0
    assert [m["content"] for m in trajectory.messages][:2] == ["What is 1 + 2?", "Be brief."]
    assert row["prompt"] == [{"role": "user", "content": "What is 1 + 2?"}]


def test_an_agent_that_raises_ends_its_trajectory_with_error_logged_once(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "plugrl_openai_agent.loop")
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{AGENTS}:raises"), part_context())
    try:
        for index in range(2):
            session = ScriptedSession(tokenizer, ["3"], sample_id=f"u/{index}")
            [trajectory] = asyncio.run(loop.run(row_for(tokenizer), session))
            assert trajectory.finish_reason == "error"
            assert trajectory.metrics["agent_errors"] == 1.0
            assert trajectory.reward is None
    finally:
        loop.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"agent {AGENTS}:raises raised ValueError: no answer found (sample u/0; later samples "
        "failing the same way are counted in agent_errors)"
    ]


def test_failures_that_differ_per_sample_log_a_few_lines_only(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "plugrl_openai_agent.loop")
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{AGENTS}:raises_per_sample"), part_context())
    try:
        for index in range(MAX_WARNINGS + 2):
            session = ScriptedSession(tokenizer, ["3"], sample_id=f"u{index}/0")
            asyncio.run(loop.run(row_for(tokenizer), session))
    finally:
        loop.close()
    assert len(caplog.records) == MAX_WARNINGS


def test_an_agent_returning_something_else_than_a_number_is_an_error(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "plugrl_openai_agent.loop")
    [trajectory] = run_agent("returns_text", ScriptedSession(tokenizer, ["3"]))
    assert trajectory.finish_reason == "error"
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            f"agent {AGENTS}:returns_text returned a str; return the episode's reward (a number) "
            "or None (sample"
        )
    )


def test_an_agent_past_its_time_is_cancelled(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "plugrl_openai_agent.loop")
    [trajectory] = run_agent("sleeps", ScriptedSession(tokenizer, ["3"]), timeout_s=0.5)
    assert trajectory.finish_reason == "error"
    assert trajectory.num_turns == 1
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            f"agent {AGENTS}:sleeps took over 0.5 s (rollout.agent.loop_args.timeout_s) (sample"
        )
    )


def test_an_agent_that_never_calls_the_model_leaves_an_empty_error_trajectory(tokenizer, caplog):
    caplog.set_level(logging.WARNING, "plugrl_openai_agent.loop")
    [trajectory] = run_agent("silent", ScriptedSession(tokenizer, []))
    assert trajectory.prompt_ids == row_for(tokenizer)["raw_prompt_ids"]
    assert trajectory.response_ids == [] and trajectory.finish_reason == "error"
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(f"agent {AGENTS}:silent made no call to the model (sample")
    )


def test_close_stops_the_endpoint(tokenizer):
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{AGENTS}:solve"), part_context())
    session = ScriptedSession(tokenizer, [CALL_TEXT, "3"])
    asyncio.run(loop.run(row_for(tokenizer), session))
    url = loop.endpoint.sample_url(session.sample_id)
    loop.close()
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=5)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


# --------------------------------------------------------------------------------------------
# Choosing the agent


def test_the_recipe_chooses_the_loop_and_checks_its_options():
    recipe = make_recipe(
        {"rollout.agent.loop": "openai", "rollout.agent.loop_args": {"agent": f"{AGENTS}:solve"}}
    )
    assert recipe.rollout.agent.loop_args == {"agent": f"{AGENTS}:solve"}
    with pytest.raises(RecipeError) as caught:
        make_recipe({"rollout.agent.loop": "openai"})
    assert str(caught.value) == (
        "rollout.agent.loop_args.agent: set it to your agent function, "
        "'package.module:function' or 'path/to/file.py:function' (got '')"
    )


def test_without_openai_the_loop_is_listed_unavailable_with_its_install_line(
    plugrl_plugin_manager, monkeypatch
):
    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed
    entry = plugrl_plugin_manager.registry("agent_loops").get("openai")
    assert entry.unavailable_reason == "needs openai (pip install 'plugrl[agents]')"
    with pytest.raises(RecipeError) as caught:
        build_recipe(
            {"rollout": {"agent": {"loop": "openai", "loop_args": {"agent": "a:b"}}}},
            plugrl_plugin_manager,
        )
    assert str(caught.value) == (
        "rollout.agent.loop: agent loop 'openai' (plugin 'openai_agent') is installed but cannot "
        "run here: it needs openai (pip install 'plugrl[agents]')"
    )


@pytest.mark.parametrize(
    ("agent", "agent_args", "message"),
    [
        (
            "no_such_package_xyz.agent:solve",
            {},
            "rollout.agent.loop_args.agent: cannot import 'no_such_package_xyz.agent' (No module "
            "named 'no_such_package_xyz'); install the package that holds the agent, or give "
            "'path/to/file.py:function'",
        ),
        (
            f"{AGENTS}:nope",
            {},
            f"rollout.agent.loop_args.agent: {AGENTS} has no 'nope'; name the agent function",
        ),
        (
            f"{AGENTS}:NOT_A_FUNCTION",
            {},
            f"rollout.agent.loop_args.agent: {AGENTS}:NOT_A_FUNCTION is a int, not a function",
        ),
        (
            f"{AGENTS}:no_model",
            {},
            f"rollout.agent.loop_args.agent: agent {AGENTS}:no_model takes neither client nor "
            "base_url, so it cannot call the model; add a client parameter",
        ),
        (
            f"{AGENTS}:no_row",
            {},
            f"rollout.agent.loop_args.agent: agent {AGENTS}:no_row takes no row: give it a first "
            "parameter for the dataset row",
        ),
        (
            f"{AGENTS}:needs_more",
            {},
            f"rollout.agent.loop_args.agent_args: agent {AGENTS}:needs_more needs 'rubric', "
            "which the loop cannot fill; give it in agent_args or a default",
        ),
        (
            f"{AGENTS}:solve",
            {"temperature": 0.5},
            f"rollout.agent.loop_args.agent_args: agent {AGENTS}:solve has no parameter "
            "'temperature'; remove it from agent_args or add it to the function",
        ),
        (
            f"{AGENTS}:takes_everything",
            {"client": None},
            "rollout.agent.loop_args.agent_args: agent_args key 'client' is an argument the loop "
            "provides; rename it",
        ),
    ],
)
def test_an_agent_the_loop_cannot_call_is_refused_in_one_line(agent, agent_args, message):
    with pytest.raises(RecipeError) as caught:
        OpenAILoop(OpenAILoopConfig(agent=agent, agent_args=agent_args), part_context())
    assert str(caught.value) == message


def test_an_agent_from_a_file(tmp_path, tokenizer):
    file = tmp_path / "my_agent.py"
    file.write_text(
        "async def run(data, client):\n"
        "    await client.chat.completions.create(model='m', messages=data['prompt'])\n"
        "    return 0.5\n"
    )
    session = ScriptedSession(tokenizer, ["3"])
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{file}:run"), part_context())
    try:
        [trajectory] = asyncio.run(loop.run(row_for(tokenizer), session))
    finally:
        loop.close()
    assert trajectory.reward == 0.5


def test_an_agent_file_that_is_missing_or_broken_is_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_xyz\n")
    cases = {
        f"{tmp_path / 'missing.py'}:run": (
            f"rollout.agent.loop_args.agent: agent file '{tmp_path / 'missing.py'}' not found"
        ),
        f"{broken}:run": (
            f"rollout.agent.loop_args.agent: {broken} failed to import: ModuleNotFoundError: No "
            f"module named 'no_such_module_xyz'; fix the file (python {broken} shows the "
            "traceback)"
        ),
    }
    for agent, message in cases.items():
        with pytest.raises(RecipeError) as caught:
            OpenAILoop(OpenAILoopConfig(agent=agent), part_context())
        assert str(caught.value) == message


# --------------------------------------------------------------------------------------------
# The page


DOC = Path(__file__).resolve().parents[4] / "docs" / "agents.md"


def doc_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"^## OpenAI-compatible endpoint.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "docs/agents.md has no section '## OpenAI-compatible endpoint'"
    return match.group(1)


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", doc_section(), re.M | re.S)


def test_the_page_lists_every_option_with_its_default():
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", doc_section(), re.M)
    fields = attrs.fields(OpenAILoopConfig)
    documented = {name: default for name, default in rows if name in {f.name for f in fields}}
    assert sorted(documented) == sorted(f.name for f in fields)
    for field in fields:
        if field.default is attrs.NOTHING or field.name == "agent":
            assert documented[field.name] == "(required)"
        elif isinstance(field.default, attrs.Factory):
            assert documented[field.name] == f"`{json.dumps(field.default.factory())}`"
        elif isinstance(field.default, float):
            assert documented[field.name] == f"`{field.default:g}`"
        else:
            assert documented[field.name] == f"`{field.default}`"


def test_the_page_recipe_builds():
    recipe = make_recipe(yaml.safe_load(code_blocks("yaml")[0]))
    assert recipe.rollout.agent.loop == "openai"
    assert recipe.rollout.agent.max_turns == 8


def test_the_page_agent_runs_and_is_rewarded(tmp_path, tokenizer):
    file = tmp_path / "page_agent.py"
    file.write_text(code_blocks("python")[0], encoding="utf-8")
    session = ScriptedSession(tokenizer, [CALL_TEXT, "The sum is 3"])
    loop = OpenAILoop(OpenAILoopConfig(agent=f"{file}:solve"), part_context())
    try:
        [trajectory] = asyncio.run(loop.run(row_for(tokenizer), session))
    finally:
        loop.close()
    assert trajectory.reward == 1.0
    assert trajectory.num_turns == 2
