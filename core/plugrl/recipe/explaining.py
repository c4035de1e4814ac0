"""``plugrl explain``: the meaning, type, default, allowed values and verl name of a recipe key
(or the keys of a section), from the metadata of the config classes, the plugins' included."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.errors import PluginError, RecipeError
from plugrl.plugins import PluginManager, get_plugin_manager
from plugrl.recipe.sections import Recipe
from plugrl.recipe.structuring import fields_of, unknown_key_error
from plugrl.registry import section_kind


@attrs.frozen
class KeyInfo:
    """What ``plugrl explain`` prints about one key or section."""

    key: str
    help: str
    type: str
    default: Any
    verl: str | None
    choices: list[Any] | None
    owner: str  # "core" or "plugin NAME"
    is_section: bool = False
    children: tuple[str, ...] = ()


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default_of(field: attrs.Attribute) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def _config_classes(section_name: str, plugins: PluginManager) -> list[tuple[type, str]]:
    """The base class of a section, then each registered plugin config class extending it."""
    kind = section_kind(section_name)
    if kind is None:
        return [(fields_of(Recipe)[section_name].type, "core")]
    base = kind.section_base()
    classes: list[tuple[type, str]] = [(base, "core")]
    for entry in plugins.registry(kind.name):
        try:
            cls = entry.load_config()
        except PluginError:
            continue
        extends_base = isinstance(cls, type) and issubclass(cls, base)
        if extends_base and cls is not base and all(cls is not c for c, _ in classes):
            classes.append((cls, f"{entry.name} ({entry.plugin})"))
    return classes


def explain(key: str, plugins: PluginManager | None = None) -> KeyInfo:
    """Describe a dotted recipe key (or a section): meaning, type, default, verl name."""
    plugins = plugins or get_plugin_manager()
    parts = key.split(".")
    recipe_fields = fields_of(Recipe)
    if parts[0] not in recipe_fields:
        raise unknown_key_error(Recipe, parts[0], "")
    if len(parts) == 1:
        children: list[str] = []
        for cls, _owner in _config_classes(parts[0], plugins):
            children += [n for n in fields_of(cls) if n not in children]
        field = recipe_fields[parts[0]]
        return KeyInfo(
            key,
            field.metadata.get("help", ""),
            "section",
            None,
            None,
            None,
            "core",
            True,
            tuple(children),
        )
    last_error: RecipeError | None = None
    for cls, owner in _config_classes(parts[0], plugins):
        try:
            return _explain_in(cls, parts, owner, plugins)
        except RecipeError as exc:
            last_error = last_error or exc
    assert last_error is not None
    raise last_error


def _explain_in(cls: type, parts: list[str], owner: str, plugins: PluginManager) -> KeyInfo:
    current = cls
    for depth, name in enumerate(parts[1:], start=1):
        fields = fields_of(current)
        if name not in fields:
            raise unknown_key_error(current, name, ".".join(parts[:depth]))
        field = fields[name]
        ftype = field.type
        if depth == len(parts) - 1:
            key = ".".join(parts)
            if isinstance(ftype, type) and attrs.has(ftype):
                return KeyInfo(
                    key,
                    field.metadata.get("help", ""),
                    "section",
                    None,
                    field.metadata.get("verl"),
                    None,
                    owner,
                    True,
                    tuple(fields_of(ftype)),
                )
            choices = field.metadata.get("choices")
            kind = field.metadata.get("registry")
            if kind:
                choices = plugins.registry(kind).names()
            return KeyInfo(
                key,
                field.metadata.get("help", ""),
                _type_name(ftype),
                _default_of(field),
                field.metadata.get("verl"),
                list(choices) if choices is not None else None,
                owner,
            )
        if not (isinstance(ftype, type) and attrs.has(ftype)):
            raise RecipeError(
                f"{field.name!r} is an option, not a section", key=".".join(parts[: depth + 1])
            )
        current = ftype
    raise RecipeError("not found", key=".".join(parts))
