"""A tool class written for verl (importing verl's BaseTool and ToolResponse) runs without
verl: through the verl tool YAML as it is, with plugrl's stand-ins put in place for its import,
or ported with one changed import line."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import textwrap

import pytest
import yaml

from plugrl.agents.verl_compat import (
    BaseTool,
    OpenAIFunctionToolSchema,
    ToolResponse,
    verl_stand_ins,
)
from plugrl.agents.verl_tools import tools_from_verl_yaml
from plugrl.errors import PluginError
from plugrl.parts.agent import ToolContext

without_verl = pytest.mark.skipif(
    importlib.util.find_spec("verl") is not None, reason="verl is installed"
)

# a verl user's tool file, word for word as it would be written for verl
VERL_USERS_TOOL = '''
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class CountTool(BaseTool):
    """Counts the letters of a word; rewards a sample that asked about the row's word."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instances = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"word": kwargs["create_kwargs"]["word"], "asked": False}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        state = self._instances[instance_id]
        word = parameters["word"]
        state["asked"] = state["asked"] or word == state["word"]
        letter = self.config.get("letter", "r")
        text = f"{word!r} has {word.count(letter)} {letter}"
        return ToolResponse(text=text), 0.0, {"length": len(word)}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 1.0 if self._instances[instance_id]["asked"] else 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]
'''

SCHEMA = {
    "type": "function",
    "function": {
        "name": "count_letters",
        "description": "Count a letter in a word.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word."}},
            "required": ["word"],
        },
    },
}
ROW = {"extra_info": {"tools_kwargs": {"count_letters": {"create_kwargs": {"word": "strawberry"}}}}}


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """write(name, source) -> the dotted name of a module of the user's, importable."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def tool_file(tmp_path, class_name, schema=SCHEMA):
    path = tmp_path / "tools.yaml"
    entry = {"class_name": class_name, "config": {"type": "native", "letter": "r"}}
    if schema is not None:
        entry["tool_schema"] = schema
    path.write_text(yaml.safe_dump({"tools": [entry]}), encoding="utf-8")
    return path


def play(tool):
    async def episode():
        context = ToolContext(row=ROW, sample_id="u/0")
        answer = await tool.call({"word": "strawberry"}, context)
        reward = await tool.calc_reward("u/0", ROW)
        await tool.release("u/0")
        return answer, reward

    return asyncio.run(episode())


@without_verl
def test_a_verl_users_tool_file_runs_as_it_is_without_verl(tmp_path, user_module):
    module = user_module("count_tool_as_written", VERL_USERS_TOOL)
    (tool,) = tools_from_verl_yaml(tool_file(tmp_path, f"{module}.CountTool"), None)
    assert tool.name == "count_letters"
    answer, reward = play(tool)
    assert (answer.text, answer.error, answer.metrics) == (
        "'strawberry' has 3 r",
        False,
        {"length": 10.0},
    )
    assert reward == 1.0
    assert tool.target._instances == {}
    # the class reads its schema as verl's classes do, by attribute
    assert tool.target.tool_schema.function.parameters.required == ["word"]
    # the stand-ins were there for the import only: nothing else takes them for verl
    assert "verl" not in sys.modules
    assert importlib.util.find_spec("verl") is None


@without_verl
def test_a_verl_users_tool_that_needs_more_of_verl_is_told_what_is_missing(tmp_path, user_module):
    module = user_module(
        "traced_tool",
        VERL_USERS_TOOL.replace(
            "from uuid import uuid4\n",
            "from uuid import uuid4\nfrom verl.utils.rollout_trace import rollout_trace_op\n",
        ),
    )
    with pytest.raises(PluginError) as raised:
        tools_from_verl_yaml(tool_file(tmp_path, f"{module}.CountTool"), None)
    assert str(raised.value) == (
        f"rollout.agent.tool_config_path: tools.yaml: tools[0].class_name {module}.CountTool "
        "imports verl.utils, which plugrl's stand-ins for verl do not offer (they offer "
        "verl.tools.base_tool and verl.tools.schemas): pip install verl, or import that from "
        "elsewhere"
    )
    assert "verl" not in sys.modules


def test_a_tool_ported_with_one_import_line_runs_and_gives_its_own_schema(tmp_path, user_module):
    ported = VERL_USERS_TOOL.replace(
        "from verl.tools.base_tool import BaseTool\n"
        "from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse\n",
        "from plugrl.agents.verl_compat import BaseTool, OpenAIFunctionToolSchema, ToolResponse\n",
    )
    ported += textwrap.dedent(
        f"""

        class SelfDescribing(CountTool):
            def get_openai_tool_schema(self):
                return OpenAIFunctionToolSchema.model_validate({SCHEMA!r})
        """
    )
    module = user_module("count_tool_ported", ported)
    (tool,) = tools_from_verl_yaml(tool_file(tmp_path, f"{module}.SelfDescribing", None), None)
    assert tool.schema() == SCHEMA
    answer, reward = play(tool)
    assert (answer.text, reward) == ("'strawberry' has 3 r", 1.0)


def test_the_stand_ins_have_verls_defaults_and_schemas_read_by_attribute():
    schema = OpenAIFunctionToolSchema.model_validate(SCHEMA)
    assert schema.function.name == "count_letters"
    assert schema.function.parameters.properties["word"].description == "The word."
    assert schema.function.strict is False
    assert schema.model_dump(exclude_unset=True) == SCHEMA
    assert schema.model_dump()["function"]["strict"] is False
    tool = BaseTool({"type": "native"}, schema)
    assert tool.name == "count_letters" and tool.get_openai_tool_schema() == schema
    instance, response = asyncio.run(tool.create())
    assert isinstance(response, ToolResponse) and response.is_empty() and instance
    answer, reward, metrics = asyncio.run(tool.execute(instance, {}))
    assert (answer.text, reward, metrics) == ("Updated the tool state.", 0.0, {})
    assert asyncio.run(tool.calc_reward(instance)) == 0.0
    with pytest.raises(ValueError, match="OpenAIFunctionToolSchema needs function"):
        OpenAIFunctionToolSchema.model_validate({"type": "function"})
    with pytest.raises(ValueError, match="BaseTool has no tool schema"):
        BaseTool({}, None)


@without_verl
def test_the_stand_ins_are_importable_as_verl_only_inside_the_block():
    with verl_stand_ins():
        from verl.tools.base_tool import BaseTool as Imported
        from verl.tools.schemas import ToolResponse as ImportedResponse

    assert (Imported, ImportedResponse) == (BaseTool, ToolResponse)
    assert not any(name == "verl" or name.startswith("verl.") for name in sys.modules)
