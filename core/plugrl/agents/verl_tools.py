"""verl's tool YAML: the ``tools:`` file of ``multi_turn.tool_config_path``, read into tools.

Each entry names a class written in verl's style (``class_name``), its ``config`` (a mapping
whose ``type`` is ``native``) and, optionally, its OpenAI ``tool_schema``::

    tools:
      - class_name: my_tools.search.SearchTool
        config: {type: native, top_k: 3}
        tool_schema: {type: function, function: {name: search, description: ..., parameters: ...}}

Such a class is built as ``cls(config=..., tool_schema=...)`` and has verl's async methods
``create(instance_id=None, **kwargs) -> (instance_id, response)``,
``execute(instance_id, parameters, **kwargs) -> (response, reward, metrics)``,
``calc_reward(instance_id, **kwargs) -> float`` and ``release(instance_id, **kwargs)``.
:func:`tools_from_verl_yaml` wraps each in a :class:`VerlStyleTool`, named by its schema: one
instance per sample, created at its first call with the row's ``tools_kwargs`` (verl's column,
or ``extra_info.tools_kwargs``) and released when the sample's trajectory ends. verl itself is
needed only for classes of verl's own modules: a user's class that imports
``verl.tools.base_tool`` or ``verl.tools.schemas`` is imported with the stand-ins of
:mod:`plugrl.agents.verl_compat` in their place when verl is not installed.

For the session that builds a run's tools: call :func:`tools_from_verl_yaml` once, with
``rollout.agent.tool_config_path`` and the run's part context, when the path is set; offer
the tools it returns beside those of ``rollout.agent.tools`` (a name in both is a recipe
error); call them and ``release(sample_id)`` them like any tool. A session that gives an
episode reward may add :meth:`VerlStyleTool.calc_reward` before the release.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import Tool, ToolConfig, ToolContext, ToolResult

if TYPE_CHECKING:
    from plugrl.parts.context import PartContext

KEY = "rollout.agent.tool_config_path"


class VerlStyleTool(Tool):
    """A tool that drives an object with verl's tool methods: per sample, ``create`` at the
    first call, ``execute`` for each call, ``calc_reward`` on request and ``release`` at the
    end."""

    def __init__(self, target: Any, schema: dict[str, Any], context: PartContext) -> None:
        super().__init__(ToolConfig(), context)
        self.target = target
        self._schema = schema
        self.name = schema["function"]["name"]  # type: ignore[misc]
        self._instances: dict[str, asyncio.Task[str]] = {}

    def schema(self) -> dict[str, Any]:
        return self._schema

    def _kwargs(self, row: Mapping[str, Any], kind: str) -> dict[str, Any]:
        tools_kwargs = row.get("tools_kwargs")
        if not tools_kwargs:
            tools_kwargs = (row.get("extra_info") or {}).get("tools_kwargs") or {}
        return dict((tools_kwargs.get(self.name) or {}).get(kind) or {})

    async def _instance(self, context: ToolContext) -> str:
        # parallel calls of one turn share the instance the first of them creates
        task = self._instances.get(context.sample_id)
        if task is None:
            create_kwargs = self._kwargs(context.row, "create_kwargs")
            task = asyncio.ensure_future(self.target.create(create_kwargs=create_kwargs))
            self._instances[context.sample_id] = task
        try:
            created = await task
        except BaseException:
            # a create that failed is tried again at the sample's next call
            if self._instances.get(context.sample_id) is task:
                del self._instances[context.sample_id]
            raise
        return _instance_id(created)

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        instance_id = await self._instance(context)
        answer = await self.target.execute(
            instance_id, dict(arguments), **self._kwargs(context.row, "execute_kwargs")
        )
        response, reward, metrics = answer if isinstance(answer, tuple) else (answer, None, {})
        return ToolResult(
            text=_response_text(response),
            reward=None if reward is None else float(reward),
            metrics={
                key: float(value)
                for key, value in (metrics or {}).items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            },
        )

    async def calc_reward(self, sample_id: str, row: Mapping[str, Any]) -> float | None:
        """The target's ``calc_reward`` for the sample's instance (``None`` when the sample
        never called the tool): an episode reward a session may add at the trajectory's
        end."""
        task = self._instances.get(sample_id)
        if task is None:
            return None
        reward = await self.target.calc_reward(
            _instance_id(await task), **self._kwargs(row, "calc_reward_kwargs")
        )
        return float(reward)

    async def release(self, sample_id: str) -> None:
        task = self._instances.pop(sample_id, None)
        if task is None:
            return
        try:
            instance_id = _instance_id(await task)
        except Exception:
            return  # never created: nothing to release
        await self.target.release(instance_id)


def _instance_id(created: Any) -> str:
    """verl's ``create`` returns ``(instance_id, response)``; older tools, the id alone."""
    return created[0] if isinstance(created, tuple) else created


def _response_text(response: Any) -> str:
    """The text of verl's ``ToolResponse`` (or of a plain string or ``{"text": ...}``)."""
    if isinstance(response, str):
        return response
    if isinstance(response, Mapping):
        return str(response.get("text") or "")
    return str(getattr(response, "text", None) or "")


def _load_class(class_name: str, where: str) -> type:
    module_name, _, attribute = class_name.rpartition(".")
    if not module_name:
        raise RecipeError(
            f"{where}.class_name {class_name!r} is not a dotted path; write it as "
            "package.module.ClassName",
            KEY,
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _is_verl(exc.name) or _is_verl(module_name):
            raise _import_error(class_name, module_name, where, exc) from None
        # a user's class written against verl's tool API: import it with the stand-ins
        from plugrl.agents.verl_compat import STAND_IN_MODULES, verl_stand_ins

        try:
            with verl_stand_ins():
                module = importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            if _is_verl(again.name):
                raise PluginError(
                    f"{KEY}: {where}.class_name {class_name} imports {again.name}, which "
                    f"plugrl's stand-ins for verl do not offer (they offer "
                    f"{' and '.join(STAND_IN_MODULES)}): pip install verl, or import that "
                    "from elsewhere"
                ) from None
            raise _import_error(class_name, module_name, where, again) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise PluginError(
            f"{KEY}: {where}.class_name {class_name}: module {module_name} has no {attribute}"
        ) from None


def _is_verl(module_name: str | None) -> bool:
    return bool(module_name) and module_name.split(".")[0] == "verl"


def _import_error(
    class_name: str, module_name: str, where: str, exc: ModuleNotFoundError
) -> PluginError:
    if _is_verl(module_name) and _is_verl(exc.name):
        return PluginError(
            f"{KEY}: {where}.class_name {class_name} is a tool of verl, which is not "
            "installed: pip install verl, or write the tool as a plugrl tool (docs/agents.md)"
        )
    return PluginError(
        f"{KEY}: {where}.class_name {class_name} cannot be imported ({exc}); install its "
        "package or put its folder on PYTHONPATH"
    )


def _schema_argument(schema: dict[str, Any] | None) -> Any:
    """The ``tool_schema`` a verl-style class is built with: verl's pydantic schema when verl
    is installed (its classes read it by attribute and dump it), else plugrl's stand-in
    (:class:`plugrl.agents.verl_compat.OpenAIFunctionToolSchema`)."""
    if schema is None:
        return None
    try:
        from verl.tools.schemas import OpenAIFunctionToolSchema
    except ImportError:
        from plugrl.agents.verl_compat import OpenAIFunctionToolSchema
    return OpenAIFunctionToolSchema.model_validate(schema)


def _schema_of(target: Any) -> Any:
    """The schema a built verl-style object gives itself, as a plain mapping."""
    getter = getattr(target, "get_openai_tool_schema", None)
    schema = getter() if getter is not None else getattr(target, "tool_schema", None)
    if hasattr(schema, "model_dump"):  # verl's pydantic schema, or plugrl's stand-in
        schema = schema.model_dump(exclude_unset=True, exclude_none=True)
    return schema


def tools_from_verl_yaml(path: str | Path, context: PartContext) -> list[Tool]:
    """The tools of a verl tool YAML file, one per entry, each named by its schema's
    ``function.name``.

    Raises :class:`~plugrl.errors.RecipeError` for a file that is missing or not of verl's
    shape, and :class:`~plugrl.errors.PluginError` for a class that cannot be imported (saying
    what to install) or built.
    """
    file = Path(path)
    try:
        document = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecipeError(f"cannot read {file}: {exc.strerror or exc}", KEY) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{file} is not valid YAML: {str(exc).splitlines()[0]}", KEY) from None
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise RecipeError(
            f"{file} has no 'tools:' list; verl's tool YAML is tools: [{{class_name: ..., "
            "config: {type: native}, tool_schema: ...}]",
            KEY,
        )
    tools: list[Tool] = []
    for index, entry in enumerate(entries):
        where = f"{file.name}: tools[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise RecipeError(f"{where} needs a class_name (package.module.ClassName)", KEY)
        config = dict(entry.get("config") or {})
        kind = str(config.get("type", "native")).lower()
        if kind != "native":
            raise RecipeError(
                f"{where} is a tool of type {kind!r}; only type native is read (an MCP server's "
                "tools need a plugrl tool plugin that calls it)",
                KEY,
            )
        schema = entry.get("tool_schema")
        if schema is not None and not _is_function_schema(schema):
            raise RecipeError(
                f"{where}.tool_schema must be {{type: function, function: {{name: ..., "
                "description: ..., parameters: ...}}}",
                KEY,
            )
        cls = _load_class(entry["class_name"], where)
        try:
            target = cls(config=config, tool_schema=_schema_argument(schema))
        except Exception as exc:
            raise PluginError(
                f"{KEY}: {where}: {entry['class_name']}(config=..., tool_schema=...) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if schema is None:
            schema = _schema_of(target)
            if not _is_function_schema(schema):
                raise RecipeError(
                    f"{where} has no tool_schema and {entry['class_name']} gives none", KEY
                )
        tools.append(VerlStyleTool(target, dict(schema), context))
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RecipeError(f"{file.name} names the tool {duplicates[0]!r} twice", KEY)
    return tools


def _is_function_schema(schema: Any) -> bool:
    return (
        isinstance(schema, Mapping)
        and isinstance(schema.get("function"), Mapping)
        and isinstance(schema["function"].get("name"), str)
    )
