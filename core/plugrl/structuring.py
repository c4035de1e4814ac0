"""Reading mappings into attrs config classes with cattrs, and turning what goes wrong into
one :class:`~plugrl.errors.RecipeError` that names the dotted key: an unknown key (with the
closest name, or plugrl's name for a verl key), a value of the wrong type, a value a validator
rejects."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import cattrs

from plugrl.config import ConfigValueError
from plugrl.errors import RecipeError


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise TypeError(f"expected a number, got {value!r}")


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise TypeError(f"expected an integer, got {value!r}")


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError(f"expected true or false, got {value!r}")


def _structure_str(value: Any, _: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"expected a string, got {value!r}")


def _structure_str_list(value: Any, _: Any) -> list[str]:
    # `train_files: one.parquet` is common enough to accept a single string
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [_structure_str(item, str) for item in value]
    raise TypeError(f"expected a list of strings, got {value!r}")


@functools.cache
def converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook_func(lambda tp: tp == list[str], _structure_str_list)
    return conv


def fields_of(cls: type) -> dict[str, attrs.Attribute]:
    """The attrs fields of ``cls`` by name, with their types resolved."""
    attrs.resolve_types(cls)
    return {f.name: f for f in attrs.fields(cls)}


def describe_value(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def structure(cls: type, raw: Any, key: str, verl_names: Mapping[str, str] | None = None) -> Any:
    """Read ``raw`` (a mapping) into ``cls``: unknown keys, wrong types and invalid values give
    a :class:`RecipeError` naming the dotted key. ``verl_names`` (verl key -> plugrl key) turns
    an unknown key that is verl's name into a hint naming plugrl's."""
    check_keys(cls, raw, key, verl_names)
    try:
        return converter().structure(raw, cls)
    except Exception as exc:
        raise _type_error(cls, raw, key, exc) from None


def check_keys(cls: type, raw: Any, key: str, verl_names: Mapping[str, str] | None = None) -> None:
    """Reject keys ``cls`` does not have, suggesting the closest (or the plugrl name of a verl
    key, from ``verl_names``)."""
    fields = fields_of(cls)
    if not isinstance(raw, Mapping):
        raise RecipeError(
            f"expected a section of keys ({', '.join(fields)}), got {describe_value(raw)}", key=key
        )
    for name, value in raw.items():
        dotted = f"{key}.{name}" if key else str(name)
        if name not in fields:
            raise unknown_key_error(cls, str(name), key, value, verl_names)
        ftype = fields[name].type
        if isinstance(ftype, type) and attrs.has(ftype) and value is not None:
            check_keys(ftype, value, dotted, verl_names)


def _leaf_keys(prefix: str, value: Any) -> Iterator[str]:
    if isinstance(value, Mapping) and value:
        for name, sub in value.items():
            yield from _leaf_keys(f"{prefix}.{name}", sub)
    else:
        yield prefix


def unknown_key_error(
    cls: type,
    name: str,
    parent: str,
    value: Any = None,
    verl_names: Mapping[str, str] | None = None,
) -> RecipeError:
    """The one-line error of key ``parent.name`` that ``cls`` does not have: plugrl's name
    when it is a verl key ``verl_names`` knows, else the closest key or the valid ones."""
    fields = list(fields_of(cls))
    dotted = f"{parent}.{name}" if parent else name
    for leaf in _leaf_keys(dotted, value):
        verl_hit = (verl_names or {}).get(leaf)
        if verl_hit:
            return RecipeError(
                f"unknown key; {leaf!r} is verl's name, plugrl's is {verl_hit!r}", key=leaf
            )
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    if close:
        fix = f"did you mean {(parent + '.' if parent else '') + close[0]!r}?"
    else:
        fix = f"valid keys: {', '.join(fields)}"
    return RecipeError(f"unknown key; {fix}", key=dotted)


def _error_path(exc: BaseException) -> tuple[list[str], BaseException]:
    """Follow a cattrs error group down to its first leaf, collecting attribute names."""
    path: list[str] = []
    # exception groups (cattrs uses the exceptiongroup backport on Python 3.10)
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
        for note in getattr(exc, "__notes__", None) or []:
            if "@ attribute " in note:
                path.append(note.rsplit("@ attribute ", 1)[1].strip())
    if isinstance(exc, ConfigValueError):
        path.append(exc.attribute)
    return path, exc


def _type_error(cls: type, raw: Mapping[str, Any], key: str, exc: Exception) -> RecipeError:
    """Turn a cattrs/attrs failure into one line that names the dotted key."""
    path, leaf = _error_path(exc)
    value: Any = raw
    for name in path:
        value = value.get(name) if isinstance(value, Mapping) else None
    dotted = ".".join([key, *path]) if key else ".".join(path)
    message = (
        leaf.message
        if isinstance(leaf, ConfigValueError)
        else (str(leaf.args[0]) if leaf.args else type(leaf).__name__)
    )
    if "got" not in message:
        message += f" (got {describe_value(value)})"
    return RecipeError(message, key=dotted or None)
