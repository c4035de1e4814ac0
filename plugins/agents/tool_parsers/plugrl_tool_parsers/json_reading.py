"""Reading the JSON of a tool call without ever raising on what a model wrote.

``json.loads`` raises ``RecursionError`` (not ``JSONDecodeError``) on text nested about a
thousand deep, a few hundred tokens a model can write; and a value nested hundreds deep that
does decode would raise the same later, when a tool, a chat template or a log serialises it.
Both become a call that carries ``error``."""

from __future__ import annotations

import json
from typing import Any

from plugrl.api import nested_deeper_than

MAX_DEPTH = 64
"""The deepest nesting of objects and lists a call's JSON may have: far past any tool's
arguments, and far below where Python's recursion limit is met."""


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests objects and lists deeper than ``limit`` (walked without
    recursion, as the kernel checks a recipe's nesting)."""
    return nested_deeper_than(value, limit)


def nesting_error(limit: int = MAX_DEPTH) -> str:
    return f"the JSON is nested deeper than {limit} levels"


def load_json(raw: str) -> tuple[Any, str | None]:
    """The value of ``raw`` and ``None``, or ``None`` and why it could not be read."""
    try:
        value = json.loads(raw)
    except Exception as exc:  # whatever the text, the answer is an error
        return None, _why(exc)
    if too_deep(value):
        return None, nesting_error()
    return value, None


def decode_json_at(
    decoder: json.JSONDecoder, text: str, position: int
) -> tuple[Any, int, str | None]:
    """The JSON value starting at ``position`` of ``text``, where it ends, and ``None``; or
    ``None``, ``position`` and why it could not be read."""
    try:
        value, end = decoder.raw_decode(text, position)
    except Exception as exc:  # whatever the text, the answer is an error
        return None, position, _why(exc)
    if too_deep(value):
        return None, position, nesting_error()
    return value, end, None


def _why(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return nesting_error()
    # JSONDecodeError, or a ValueError such as an integer past Python's digit limit
    return f"bad JSON: {exc}"
