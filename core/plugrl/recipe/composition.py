"""Recipe files: reading YAML, composing ``defaults``, applying ``a.b.c=value`` overrides, and
finding the recipes shipped with plugrl.

A file's ``defaults: [base.yaml, ...]`` are read first (paths relative to the file), then the
file, then the command-line overrides; mappings merge key by key, anything else replaces.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from plugrl.errors import RecipeError
from plugrl.plugin.registry import section_kind

MAX_NESTING = 100
"""The deepest nesting of mappings and lists a recipe may have: far past any real section,
and well short of where reading, merging or copying it would run out of Python's stack."""


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests mappings and lists deeper than ``limit`` (walked without
    recursion, so any depth is safe to check)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep(where: str) -> str:
    return (
        f"{where} nests mappings or lists more than {MAX_NESTING} levels deep; a recipe's "
        "sections are a few levels deep: check the file"
    )


def read_yaml(path: Path) -> dict[str, Any]:
    """One recipe file as a mapping (its ``defaults`` not yet merged)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file {str(path)!r} not found; check the path") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe file {str(path)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{path}:{where} is not valid YAML: {problem}") from None
    except RecursionError:
        raise RecipeError(_too_deep(str(path))) from None
    if nested_deeper_than(data, MAX_NESTING):
        raise RecipeError(_too_deep(str(path)))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must be a mapping of sections, not a {type(data).__name__}")
    return data


def compose_file(path: str | Path, _stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe file with its ``defaults`` merged in (recursively)."""
    path = Path(path)
    resolved = path.resolve()
    if resolved in _stack:
        cycle = " -> ".join(str(p.name) for p in (*_stack, resolved))
        raise RecipeError(f"recipe defaults form a cycle: {cycle}")
    data = read_yaml(path)
    defaults = data.pop("defaults", []) or []
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise RecipeError("must be a list of recipe file paths", key=f"{path}: defaults")
    merged: dict[str, Any] = {}
    for default in defaults:
        base = compose_file(_default_path(path.parent, default), (*_stack, resolved))
        merged = deep_merge(merged, base)
    return deep_merge(merged, normalize_shorthand(data))


def _default_path(folder: Path, default: str) -> Path:
    """A ``defaults`` entry: a file relative to the recipe's folder, or a shipped recipe by
    name (``defaults: [quickstart]``)."""
    path = folder / default
    if path.exists() or _names_a_file(Path(default)):
        return path
    return find_recipe(default)


def shorthand_key(section: str) -> str | None:
    """The key a bare string stands for in ``section`` (``device: cuda`` is
    ``device: {name: cuda}``): the key that chooses a section's part, and ``cluster.mode``."""
    if section == "cluster":
        return "mode"
    kind = section_kind(section)
    return kind.selector if kind is not None else None


def normalize_shorthand(data: Mapping[str, Any]) -> dict[str, Any]:
    """``device: cuda`` -> ``device: {name: cuda}`` (and the like for other sections)."""
    out = dict(data)
    for name, value in data.items():
        selector = shorthand_key(name) if isinstance(value, str) else None
        if selector is not None:
            out[name] = {selector: value}
    return out


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``update`` into a copy of ``base``: mappings key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


DELETE = object()
"""The value of a ``~KEY`` override: the key goes back to its default."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"actor.optim.lr=1e-6"`` -> (["actor", "optim", "lr"], 1e-06).

    The value is read as YAML (``[a, b]``, ``null``, ``true``, numbers); the field's type
    decides the rest (``1e-6`` becomes a float where a float is expected). ``~KEY`` (as in
    Hydra) removes the key, which takes its default again: :data:`DELETE`.
    """
    if text.startswith("~") and "=" not in text:
        key = text[1:].strip()
        if not key or any(not part for part in key.split(".")) or " " in key:
            raise RecipeError(f"override {text!r} is not ~KEY (for example ~model.override_config)")
        return key.split("."), DELETE
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")) or " " in key:
        raise RecipeError(f"override {text!r} is not KEY=VALUE (for example actor.optim.lr=1e-6)")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    except RecursionError:
        raise RecipeError(_too_deep(f"override {key}")) from None
    if nested_deeper_than(parsed, MAX_NESTING):
        raise RecipeError(_too_deep(f"override {key}"))
    return key.split("."), parsed


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``KEY=VALUE`` override merged in, in order."""
    out = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        if value is DELETE or value == {}:
            # ~KEY, and KEY={} which empties a mapping (merging {} into it would change nothing)
            _replace(out, path, value)
            continue
        update: Any = value
        for part in reversed(path):
            update = {part: update}
        normalized = normalize_shorthand(update)
        selector = shorthand_key(path[0])
        if len(path) > 1 and selector is not None and isinstance(out.get(path[0]), str):
            out[path[0]] = {selector: out[path[0]]}
        out = deep_merge(out, normalized)
    return out


def _replace(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``path`` in ``data`` to ``value`` without merging, or remove it for
    :data:`DELETE`."""
    node = data
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        selector = shorthand_key(part) if depth == 0 else None
        if isinstance(child, str) and selector is not None:
            child = node[part] = {selector: child}
        if not isinstance(child, dict):
            if value is DELETE:
                return  # not set, so already its default
            child = node[part] = {}
        node = child
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def shipped_recipes() -> dict[str, Path]:
    """The recipes installed with plugrl, by name (``quickstart`` -> its YAML file)."""
    from importlib import resources

    try:
        folder = resources.files("plugrl_recipes")
    except ModuleNotFoundError:
        return {}
    return {
        entry.name.removesuffix(".yaml"): Path(str(entry))
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    }


def _names_a_file(path: Path) -> bool:
    """Whether a recipe name is a file path: a YAML file name, or a path with folders. Shipped
    names may hold dots (``gsm8k-grpo-qwen2.5-0.5b``)."""
    return path.suffix in (".yaml", ".yml") or len(path.parts) > 1


def find_recipe(name: str | Path) -> Path:
    """A recipe file: the path itself, or for a bare name (``quickstart``) the shipped recipe."""
    path = Path(name)
    if path.exists() or _names_a_file(path):
        return path
    shipped = shipped_recipes()
    if str(name) in shipped:
        return shipped[str(name)]
    raise RecipeError(
        f"recipe {str(name)!r} is neither a file here nor a shipped recipe; shipped: "
        f"{', '.join(sorted(shipped)) or 'none'}"
    )
