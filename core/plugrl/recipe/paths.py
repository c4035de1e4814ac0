"""The options of a recipe that hold local paths, and their resolution to absolute paths.

An option is a path when its field says so (``option(..., path="model" | "input" |
"output")``, :data:`plugrl.config.PATH_KINDS`), in the core's sections and in plugins' alike.
A relative path is resolved once, in the process that reads the recipe (the driver), against
its working folder, whether it came from a recipe file or from a ``KEY=VALUE`` override: that
is the folder a user runs ``plugrl run`` from, and Ray workers start in folders of their own,
on other machines too. Values with a scheme (``hdfs://...``) and a path option's words
(``trainer.resume_mode: auto``) are left as they are; ``~`` is expanded.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.config.structuring import fields_of

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe.sections import Recipe


@attrs.frozen
class PathOption:
    """One path option of a recipe: its dotted key, what it names
    (:data:`~plugrl.config.PATH_KINDS`) and its paths (none when unset; a list option, one
    each)."""

    key: str
    kind: str
    paths: tuple[str, ...]


def resolve_path(value: str, base: str | Path, words: tuple[str, ...] = ()) -> str:
    """``value`` as an absolute, normalised path (``~`` expanded, relative to ``base``); a
    word of the option or a URL as it is."""
    if value in words or "://" in value or not value:
        return value
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))


def resolve_value(value: Any, base: str | Path, words: tuple[str, ...] = ()) -> Any:
    """A path option's value with :func:`resolve_path` applied to each path in it."""
    if isinstance(value, str):
        return resolve_path(value, base, words)
    if isinstance(value, list):
        return [resolve_value(item, base, words) for item in value]
    return value


def _paths_of(value: Any, words: tuple[str, ...]) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(
        v for v in values if isinstance(v, str) and v and v not in words and "://" not in v
    )


def _config_paths(config: Any, prefix: str) -> Iterator[tuple[str, Any, attrs.Attribute]]:
    """(dotted key, owner, field) of every path option of a config object and the sections
    nested in it, by their runtime classes (a plugin's subclass adds its own)."""
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        if field.metadata.get("path"):
            yield f"{prefix}{field.name}", config, field
        elif attrs.has(type(value)):
            yield from _config_paths(value, f"{prefix}{field.name}.")


def _mapping_paths(
    cls: type, raw: Mapping[str, Any], prefix: str
) -> Iterator[tuple[str, Mapping[str, Any], attrs.Attribute]]:
    """(dotted key, holder, field) of every path option set in ``raw``, a section not yet read
    into its config class ``cls``."""
    for name, field in fields_of(cls).items():
        if name not in raw:
            continue
        value = raw[name]
        if field.metadata.get("path"):
            yield f"{prefix}{name}", raw, field
        elif isinstance(field.type, type) and attrs.has(field.type) and isinstance(value, Mapping):
            yield from _mapping_paths(field.type, value, f"{prefix}{name}.")


def _component_class(section: Mapping[str, Any], plugins: PluginManager | None) -> type:
    """The config class a reward component's section is read into: its manager's, or without
    the plugins at hand the reward section's base class, whose options every manager has."""
    from plugrl.parts.reward import RewardConfig

    if plugins is None:
        return RewardConfig
    config_cls = plugins.registry("reward_managers").get(str(section["manager"])).load_config()
    return config_cls or RewardConfig


def _component_paths(
    recipe: Recipe, plugins: PluginManager | None
) -> Iterator[tuple[str, Mapping[str, Any], attrs.Attribute]]:
    for name, section in recipe.reward.components.items():
        cls = _component_class(section, plugins)
        yield from _mapping_paths(cls, section, f"reward.components.{name}.")


def path_options(recipe: Recipe, plugins: PluginManager | None = None) -> list[PathOption]:
    """Every path option of ``recipe``, set or not, with its paths: the options of each
    section's class (the chosen plugins' included) and of the sections of
    ``reward.components`` (read by their managers' classes from ``plugins``; without them,
    only the options every reward manager has)."""
    options = [
        PathOption(
            key, field.metadata["path"], _paths_of(getattr(owner, field.name), _words(field))
        )
        for key, owner, field in _config_paths(recipe, "")
    ]
    for key, holder, field in _component_paths(recipe, plugins):
        paths = _paths_of(holder[field.name], _words(field))
        options.append(PathOption(key, field.metadata["path"], paths))
    return options


def _words(field: attrs.Attribute) -> tuple[str, ...]:
    return tuple(field.metadata.get("path_words") or ())


def resolve_paths(
    recipe: Recipe, plugins: PluginManager | None = None, base: str | Path | None = None
) -> Recipe:
    """A copy of ``recipe`` whose relative paths are absolute, resolved against ``base`` (the
    working folder when unset); resolving again changes nothing. ``plugins`` give the classes
    of reward components' sections (see :func:`path_options`)."""
    base = Path.cwd() if base is None else Path(base)
    resolved = copy.deepcopy(recipe)
    for _, owner, field in list(_config_paths(resolved, "")):
        value = getattr(owner, field.name)
        object.__setattr__(owner, field.name, resolve_value(value, base, _words(field)))
    for _, holder, field in list(_component_paths(resolved, plugins)):
        assert isinstance(holder, dict)
        holder[field.name] = resolve_value(holder[field.name], base, _words(field))
    return resolved


def path_keys(recipe: Recipe, plugins: PluginManager | None = None) -> set[str]:
    """The dotted keys of ``recipe``'s path options (:func:`path_options`)."""
    return {option.key for option in path_options(recipe, plugins)}
