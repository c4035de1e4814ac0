"""verl's tool YAML read into tools: a verl-style class of the user's own, without verl, and
every way a file can be wrong, each with its one-line message."""

from __future__ import annotations

import asyncio
import importlib.util

import attrs
import pytest
import yaml

from plugrl.agents.verl_tools import VerlStyleTool, tools_from_verl_yaml
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import AgentConfig, ToolContext

MODULE = "tests.core.agents.verl_style_tools"
SCHEMA = {
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the answer.",
        "parameters": {
            "type": "object",
            "properties": {"guess": {"type": "string", "description": "Your guess."}},
            "required": ["guess"],
        },
    },
}
ROW = {
    "prompt": [{"role": "user", "content": "Guess."}],
    "extra_info": {
        "tools_kwargs": {
            "guess": {
                "create_kwargs": {"ground_truth": "42"},
                "execute_kwargs": {"suffix": "!"},
            }
        }
    },
}


def write(tmp_path, tools, name="tools.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"tools": tools}), encoding="utf-8")
    return path


def entry(class_name=f"{MODULE}.GuessTool", **extra):
    return {"class_name": class_name, "config": {"type": "native", "level": 2}, **extra}


def test_a_users_verl_style_class_becomes_a_tool_named_by_its_schema(tmp_path):
    (tool,) = tools_from_verl_yaml(write(tmp_path, [entry(tool_schema=SCHEMA)]), None)
    assert isinstance(tool, VerlStyleTool)
    assert tool.name == "guess" and tool.schema() == SCHEMA
    assert tool.target.config == {"type": "native", "level": 2}

    async def episode():
        context = ToolContext(row=ROW, sample_id="uid/0")
        # two calls of one turn, at once: one instance, created with the row's create_kwargs
        wrong, right = await asyncio.gather(
            tool.call({"guess": "7"}, context), tool.call({"guess": 42}, context)
        )
        reward = await tool.calc_reward("uid/0", ROW)
        await tool.release("uid/0")
        return wrong, right, reward

    wrong, right, reward = asyncio.run(episode())
    assert (wrong.text, wrong.reward) == ("wrong!", 0.0)
    assert (right.text, right.reward, right.metrics) == ("right!", 1.0, {"guesses": 2.0})
    assert reward == 1.0
    assert tool.target.created == 1 and tool.target.released == ["instance-1"]
    assert tool.target.instances == {}
    # a released sample, or one that never called, has nothing to release or reward
    assert asyncio.run(tool.calc_reward("uid/0", ROW)) is None
    asyncio.run(tool.release("uid/0"))


def test_samples_keep_instances_apart_and_tools_kwargs_may_be_a_column(tmp_path):
    (tool,) = tools_from_verl_yaml(write(tmp_path, [entry(tool_schema=SCHEMA)]), None)
    column_row = {"tools_kwargs": {"guess": {"create_kwargs": {"ground_truth": "7"}}}}

    async def two_samples():
        first = await tool.call({"guess": "7"}, ToolContext(row=column_row, sample_id="a/0"))
        second = await tool.call({"guess": "7"}, ToolContext(row=ROW, sample_id="a/1"))
        return first.text, second.text

    assert asyncio.run(two_samples()) == ("right", "wrong!")
    assert tool.target.created == 2


def test_a_class_may_give_its_own_schema_and_answer_with_a_string(tmp_path):
    (tool,) = tools_from_verl_yaml(write(tmp_path, [entry(f"{MODULE}.SelfDescribedTool")]), None)
    assert tool.name == "echo"
    result = asyncio.run(tool.call({"text": "hi"}, ToolContext(row={}, sample_id="u/0")))
    assert (result.text, result.reward) == ("echo hi", None)


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed")
def test_a_verl_class_without_verl_says_what_to_install(tmp_path):
    path = write(tmp_path, [entry("verl.tools.gsm8k_tool.Gsm8kTool", tool_schema=SCHEMA)])
    with pytest.raises(PluginError) as raised:
        tools_from_verl_yaml(path, None)
    assert str(raised.value) == (
        "rollout.agent.tool_config_path: tools.yaml: tools[0].class_name "
        "verl.tools.gsm8k_tool.Gsm8kTool is a tool of verl, which is not installed: "
        "pip install verl, or write the tool as a plugrl tool (docs/agents.md)"
    )


@pytest.mark.parametrize(
    ("class_name", "message"),
    [
        (
            "no_such_package.tools.Tool",
            "rollout.agent.tool_config_path: tools.yaml: tools[0].class_name "
            "no_such_package.tools.Tool cannot be imported (No module named 'no_such_package'); "
            "install its package or put its folder on PYTHONPATH",
        ),
        (
            f"{MODULE}.Missing",
            f"rollout.agent.tool_config_path: tools.yaml: tools[0].class_name {MODULE}.Missing: "
            f"module {MODULE} has no Missing",
        ),
        (
            f"{MODULE}.BrokenTool",
            f"rollout.agent.tool_config_path: tools.yaml: tools[0]: {MODULE}.BrokenTool"
            "(config=..., tool_schema=...) failed: KeyError: 'api_key'",
        ),
    ],
)
def test_a_class_that_cannot_be_built_is_named(tmp_path, class_name, message):
    with pytest.raises(PluginError) as raised:
        tools_from_verl_yaml(write(tmp_path, [entry(class_name, tool_schema=SCHEMA)]), None)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: [", "tools.yaml is not valid YAML: "),
        ("other: 1", "tools.yaml has no 'tools:' list; verl's tool YAML is tools: [{class_name: "),
        ("tools: [{config: {type: native}}]", "tools.yaml: tools[0] needs a class_name "),
        (
            "tools: [{class_name: Tool}]",
            "tools.yaml: tools[0].class_name 'Tool' is not a dotted path; write it as "
            "package.module.ClassName",
        ),
        (
            "tools: [{class_name: a.B, config: {type: mcp}}]",
            "tools.yaml: tools[0] is a tool of type 'mcp'; only type native is read",
        ),
        (
            "tools: [{class_name: a.B, tool_schema: {type: function}}]",
            "tools.yaml: tools[0].tool_schema must be {type: function, function: {name: ",
        ),
    ],
)
def test_a_file_not_of_verls_shape_is_a_recipe_error(tmp_path, text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as raised:
        tools_from_verl_yaml(path, None)
    assert raised.value.key == "rollout.agent.tool_config_path"
    assert raised.value.bare_message.replace(str(tmp_path) + "/", "").startswith(message)


def test_a_missing_file_and_a_name_given_twice_are_recipe_errors(tmp_path):
    with pytest.raises(RecipeError) as raised:
        tools_from_verl_yaml(tmp_path / "nowhere.yaml", None)
    assert str(raised.value) == (
        f"rollout.agent.tool_config_path: cannot read {tmp_path / 'nowhere.yaml'}: "
        "No such file or directory"
    )
    path = write(tmp_path, [entry(tool_schema=SCHEMA), entry(tool_schema=SCHEMA)])
    with pytest.raises(RecipeError) as raised:
        tools_from_verl_yaml(path, None)
    assert str(raised.value) == (
        "rollout.agent.tool_config_path: tools.yaml names the tool 'guess' twice"
    )


def test_the_option_carries_verls_key():
    field = attrs.fields_dict(AgentConfig)["tool_config_path"]
    assert field.default is None
    assert field.metadata["verl"] == "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    assert field.metadata["path"] == "input"


def test_a_failed_create_is_tried_again_at_the_next_call(tmp_path):
    path = write(tmp_path, [entry(f"{MODULE}.FlakyCreateTool", tool_schema=SCHEMA)])
    (tool,) = tools_from_verl_yaml(path, None)
    context = ToolContext(row=ROW, sample_id="uid/0")
    with pytest.raises(ConnectionError, match=r"^service not ready$"):
        asyncio.run(tool.call({"guess": "42"}, context))
    asyncio.run(tool.release("uid/0"))  # nothing was created: nothing to release
    assert asyncio.run(tool.call({"guess": "42"}, context)).text == "right!"
    asyncio.run(tool.release("uid/0"))
    assert tool.target.released == ["instance-1"]
