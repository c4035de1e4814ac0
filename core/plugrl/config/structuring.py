"""Reading mappings into attrs config classes with cattrs, and turning what goes wrong into
one :class:`~plugrl.errors.RecipeError` that names the dotted key: an unknown key (with the
closest name, or plugrl's name for a verl key), a value of the wrong type, a number that is not
finite, a value a validator rejects.

No option takes ``nan`` or an infinity: a float field refuses them whether the recipe spells
them ``.nan`` (YAML), ``nan``, ``inf`` or ``1e400``, and so does every other value a section
holds (a free-form mapping such as ``model.override_config``, a field without a type), since a
non-finite number passes every ``>``/``<`` validator and only fails, or silently disables
something, in the middle of a run.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import cattrs

from plugrl.config import ConfigValueError
from plugrl.errors import RecipeError


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    number: float | None = None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the floats, as good as infinite
            number = math.inf if value > 0 else -math.inf
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None:
        raise TypeError(f"expected a number, got {value!r}")
    if not math.isfinite(number):
        raise TypeError(non_finite_message(number, value))
    return number


_NON_FINITE_SPELLINGS = ("nan", "inf", "infinity")


def non_finite_message(number: float, given: Any = None) -> str:
    """The error of an option set to ``nan`` or an infinity; ``given`` is the value as the
    recipe wrote it, quoted when it is a number too large for a float (``1e400``)."""
    message = f"expected a finite number, got {number!r}"
    spelled = str(given).strip().lower().lstrip("+-").lstrip(".")
    if given is not None and not isinstance(given, float) and spelled not in _NON_FINITE_SPELLINGS:
        message += f" ({describe_value(given)} is beyond the largest float)"
    return message


def check_finite(raw: Any, key: str) -> None:
    """Raise a :class:`RecipeError` naming the dotted key of the first ``nan`` or infinity in
    ``raw`` (mappings and lists are searched): values that no field's type converts, such as
    those of a free-form mapping, are refused as the float fields refuse them."""
    if isinstance(raw, float) and not math.isfinite(raw):
        raise RecipeError(non_finite_message(raw), key=key or None)
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(raw, (list, tuple)):
        for value in raw:
            check_finite(value, key)


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


def _structure_str_or_list(value: Any, _: Any) -> str | list[str] | None:
    # a word or pattern (`all-linear`) stays a string; a list stays a list
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return _structure_str_list(value, list[str])
    raise TypeError(f"expected a string or a list of strings, got {value!r}")


def _structure_float_or_str(value: Any, _: Any) -> float | str:
    # a number stays a number (a number in a string too); other text is kept for the option's
    # own validator to read (algorithm.rollout_is_threshold's "lower_upper"): Python's float()
    # would read "5_0.5" as 50.5, so text with an underscore is never a number here
    if isinstance(value, str):
        if "_" in value:
            return value
        try:
            float(value)
        except ValueError:
            return value
    # a number, which must be finite as every float option's is
    return _structure_float(value, float)


@functools.cache
def converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook_func(lambda tp: tp == list[str], _structure_str_list)
    conv.register_structure_hook_func(
        lambda tp: tp in (str | list[str], str | list[str] | None), _structure_str_or_list
    )
    conv.register_structure_hook_func(lambda tp: tp == float | str, _structure_float_or_str)
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
    """Read ``raw`` (a mapping) into ``cls``: unknown keys, wrong types, numbers that are not
    finite and invalid values give a :class:`RecipeError` naming the dotted key.
    ``verl_names`` (verl key -> plugrl key) turns an unknown key that is verl's name into a
    hint naming plugrl's."""
    check_keys(cls, raw, key, verl_names)
    check_finite(raw, key)
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
