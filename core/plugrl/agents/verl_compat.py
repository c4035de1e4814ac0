"""Stand-ins for the verl classes a verl tool class imports, so that such a class runs in
plugrl without verl installed.

A tool written for verl starts with::

    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

Port it with one line changed, importing the same names from here::

    from plugrl.agents.verl_compat import BaseTool, OpenAIFunctionToolSchema, ToolResponse

or leave it as it is: when ``rollout.agent.tool_config_path`` names a class whose module
imports ``verl.tools.base_tool`` or ``verl.tools.schemas`` and verl is not installed, the
class's module is imported with these stand-ins in their place (:func:`verl_stand_ins`).

What is offered, with verl's names and signatures: :class:`BaseTool` (``create``,
``execute``, ``calc_reward``, ``release``, ``get_openai_tool_schema``), :class:`ToolResponse`
(``text``, ``image``, ``video``) and the schema classes :class:`OpenAIFunctionToolSchema`,
:class:`OpenAIFunctionSchema`, :class:`OpenAIFunctionParametersSchema`,
:class:`OpenAIFunctionPropertySchema` (read by attribute, built with keywords or
``model_validate(mapping)``, written back with ``model_dump()``). Other verl modules
(``verl.utils...``) are not offered: a tool that imports them needs verl.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

STAND_IN_MODULES = ("verl.tools.base_tool", "verl.tools.schemas")
"""The verl modules :func:`verl_stand_ins` puts in place."""


class _Schema:
    """A JSON object read by attribute, as verl's pydantic schemas are: the fields a class
    names (with their defaults), nested objects as their schema classes, and any other key
    kept as given (JSON schemas have many)."""

    _defaults: ClassVar[dict[str, Any]] = {}
    _required: ClassVar[tuple[str, ...]] = ()
    _nested: ClassVar[dict[str, type[_Schema]]] = {}
    _nested_maps: ClassVar[dict[str, type[_Schema]]] = {}

    def __init__(self, **values: Any) -> None:
        missing = [name for name in self._required if name not in values]
        if missing:
            raise ValueError(f"{type(self).__name__} needs {', '.join(missing)}")
        self._values: dict[str, Any] = {}
        for name, value in values.items():
            if name in self._nested and isinstance(value, Mapping):
                value = self._nested[name].model_validate(value)
            elif name in self._nested_maps and isinstance(value, Mapping):
                kind = self._nested_maps[name]
                value = {key: kind.model_validate(item) for key, item in value.items()}
            self._values[name] = value

    @classmethod
    def model_validate(cls, data: Any) -> Any:
        """``data`` (a mapping, or already one of these) as this class."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.__name__} is read from a mapping, got {type(data).__name__}")
        return cls(**data)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        if name in self._defaults:
            return self._defaults[name]
        raise AttributeError(f"{type(self).__name__} has no {name!r}")

    def model_dump(
        self, *, exclude_unset: bool = False, exclude_none: bool = False, **_: Any
    ) -> dict[str, Any]:
        """The object as plain data; ``exclude_unset`` leaves out defaults not given,
        ``exclude_none`` values that are ``None``."""
        out: dict[str, Any] = {} if exclude_unset else dict(self._defaults)
        out.update(self._values)

        def plain(value: Any) -> Any:
            if isinstance(value, _Schema):
                return value.model_dump(exclude_unset=exclude_unset, exclude_none=exclude_none)
            if isinstance(value, Mapping):
                return {key: plain(item) for key, item in value.items()}
            if isinstance(value, list):
                return [plain(item) for item in value]
            return value

        return {
            key: plain(value) for key, value in out.items() if not (exclude_none and value is None)
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Schema):
            return NotImplemented
        return type(self) is type(other) and self.model_dump() == other.model_dump()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_dump(exclude_unset=True)!r})"


class OpenAIFunctionPropertySchema(_Schema):
    """One parameter: ``type``, ``description``, ``enum``."""

    _defaults: ClassVar[dict[str, Any]] = {"description": None, "enum": None}
    _required = ("type",)


class OpenAIFunctionParametersSchema(_Schema):
    """A function's parameters: ``type`` (``object``), ``properties`` (each an
    :class:`OpenAIFunctionPropertySchema`), ``required``."""

    _defaults: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}, "required": []}
    _nested_maps: ClassVar[dict[str, type[_Schema]]] = {"properties": OpenAIFunctionPropertySchema}


class OpenAIFunctionSchema(_Schema):
    """A function: ``name``, ``description``, ``parameters``, ``strict``."""

    _defaults: ClassVar[dict[str, Any]] = {
        "description": "",
        "parameters": None,
        "strict": False,
    }
    _required = ("name",)
    _nested: ClassVar[dict[str, type[_Schema]]] = {"parameters": OpenAIFunctionParametersSchema}


class OpenAIFunctionToolSchema(_Schema):
    """A tool's OpenAI schema: ``type`` (``function``) and ``function``."""

    _defaults: ClassVar[dict[str, Any]] = {"type": "function"}
    _required = ("function",)
    _nested: ClassVar[dict[str, type[_Schema]]] = {"function": OpenAIFunctionSchema}


class ToolResponse:
    """What a verl tool's ``create`` and ``execute`` answer: ``text`` is what the model reads
    (plugrl does not pass ``image`` and ``video`` to the model)."""

    def __init__(
        self,
        text: str | None = None,
        image: list[Any] | None = None,
        video: list[Any] | None = None,
        **_: Any,
    ) -> None:
        self.text = text
        self.image = image
        self.video = video

    def is_empty(self) -> bool:
        """Whether the response holds nothing."""
        return not self.text and not self.image and not self.video

    def model_dump(self, *, exclude_none: bool = False, **_: Any) -> dict[str, Any]:
        out = {"text": self.text, "image": self.image, "video": self.video}
        return {k: v for k, v in out.items() if not (exclude_none and v is None)}

    def __repr__(self) -> str:
        return f"ToolResponse(text={self.text!r})"


class BaseTool:
    """verl's tool base class: built as ``cls(config, tool_schema)``; per sample, ``create``
    makes an instance, ``execute`` answers each call of it, ``calc_reward`` gives its reward
    and ``release`` forgets it. The defaults do what verl's do: an instance id and an empty
    response, a fixed answer, no reward, nothing to release. plugrl drives it through
    :class:`plugrl.agents.verl_tools.VerlStyleTool`."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        self.config = config
        schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        if schema is None:
            raise ValueError(
                f"{type(self).__name__} has no tool schema: give the YAML entry a tool_schema "
                "or override get_openai_tool_schema"
            )
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(schema)
        self.name: str = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """The tool's schema (the one it was built with)."""
        return self.__dict__.get("tool_schema")

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        """Start an instance for one sample; ``kwargs['create_kwargs']`` are the row's."""
        return (instance_id or str(uuid.uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        """Answer one call: ``(response, reward, metrics)``."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance."""


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name, "plugrl's stand-in (plugrl.agents.verl_compat)")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []  # a package, so that its submodules import
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


@contextmanager
def verl_stand_ins() -> Iterator[None]:
    """Within the block, ``import verl.tools.base_tool`` and ``import verl.tools.schemas``
    give this module's classes; afterwards they are removed again, so nothing else takes them
    for verl. A no-op when verl is already imported. Modules imported within the block keep
    the classes they imported."""
    if "verl" in sys.modules:
        yield
        return
    schemas = {
        name: globals()[name]
        for name in (
            "OpenAIFunctionToolSchema",
            "OpenAIFunctionSchema",
            "OpenAIFunctionParametersSchema",
            "OpenAIFunctionPropertySchema",
            "ToolResponse",
        )
    }
    added = {
        "verl": _module("verl"),
        "verl.tools": _module("verl.tools"),
        "verl.tools.schemas": _module("verl.tools.schemas", **schemas),
        "verl.tools.base_tool": _module("verl.tools.base_tool", BaseTool=BaseTool, **schemas),
    }
    added["verl"].tools = added["verl.tools"]
    added["verl.tools"].schemas = added["verl.tools.schemas"]
    added["verl.tools"].base_tool = added["verl.tools.base_tool"]
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, module in added.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
