"""Hydra's command-line overrides, as verl receives them once the shell has removed its own
quotes: ``key=value``, ``+key=value`` (add a key), ``++key=value`` (add or replace) and
``~key`` (delete), with Hydra's values: ``null``, booleans, integers, floats, quoted strings,
lists (``[console,'wandb']``), dicts (``{a: 1}``) and anything else as a string.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

_OVERRIDE = re.compile(r"(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:\.[\w\-@/]+)*)(?:=(.*))?", re.DOTALL)
_INT = re.compile(r"[+-]?\d[\d_]*")
_FLOAT = re.compile(
    r"[+-]?(?:(?:\d[\d_]*)?\.\d[\d_]*(?:[eE][+-]?\d+)?|\d[\d_]*\.?(?:[eE][+-]?\d+)|\d[\d_]*\.)"
    r"|[+-]?(?:inf|nan)",
    re.IGNORECASE,
)


class OverrideError(ValueError):
    """An override Hydra would not accept, or one that needs verl's own config to read."""


@attrs.frozen
class Override:
    """One ``key=value`` override."""

    key: str
    """The dotted key, without its ``+``/``++``/``~`` prefix."""
    value: Any
    prefix: str = ""
    """``""``, ``"+"``, ``"++"`` or ``"~"`` (delete)."""


def parse_override(text: str) -> Override:
    """``actor_rollout_ref.actor.optim.lr=1e-6`` -> Override("actor_rollout_ref...", 1e-6)."""
    match = _OVERRIDE.fullmatch(text)
    if not match:
        raise OverrideError(f"{text!r} is not a Hydra override (key=value)")
    prefix, key, value = match.group(1) or "", match.group(2), match.group(3)
    if prefix == "~":
        return Override(key, None, prefix)
    if value is None:
        raise OverrideError(f"{text!r} has no value; write {key}=VALUE")
    return Override(key, parse_value(value), prefix)


def parse_value(text: str) -> Any:
    """A Hydra value: ``null``, ``true``, ``3``, ``1e-6``, ``'a b'``, ``[a, 'b']``,
    ``{k: v}``, or a string."""
    parser = _Parser(text)
    value = parser.element(top=True)
    parser.skip_blanks()
    if parser.i < len(text):
        raise OverrideError(f"unexpected {text[parser.i :]!r} after the value in {text!r}")
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def skip_blanks(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t":
            self.i += 1

    def element(self, top: bool = False) -> Any:
        self.skip_blanks()
        c = self.text[self.i : self.i + 1]
        if c == "[":
            return self.sequence("[", "]", self.element)
        if c == "{":
            return dict(self.sequence("{", "}", self.entry))
        if c in ("'", '"'):
            start = self.i
            value = self.quoted()
            self.skip_blanks()
            if top and self.i < len(self.text):
                self.i = start  # 'a'b: a string that only starts with a quote
            else:
                return value
        return self.primitive(top)

    def sequence(self, opening: str, closing: str, item: Any) -> list[Any]:
        self.i += 1
        items: list[Any] = []
        self.skip_blanks()
        if self.text[self.i : self.i + 1] == closing:
            self.i += 1
            return items
        while True:
            items.append(item())
            self.skip_blanks()
            c = self.text[self.i : self.i + 1]
            self.i += 1
            if c == closing:
                return items
            if c != ",":
                raise OverrideError(f"{opening!r} is never closed by {closing!r} in {self.text!r}")

    def entry(self) -> tuple[str, Any]:
        self.skip_blanks()
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in ":,}":
            self.i += 1
        key = self.text[start : self.i].strip()
        if self.text[self.i : self.i + 1] != ":" or not key:
            raise OverrideError(f"a dict entry is not 'key: value' in {self.text!r}")
        self.i += 1
        return key, self.element()

    def quoted(self) -> str:
        quote = self.text[self.i]
        out: list[str] = []
        j = self.i + 1
        while j < len(self.text):
            c = self.text[j]
            if c == "\\" and self.text[j + 1 : j + 2] in (quote, "\\"):
                out.append(self.text[j + 1])
                j += 2
                continue
            if c == quote:
                self.i = j + 1
                return _no_interpolation("".join(out), self.text)
            out.append(c)
            j += 1
        raise OverrideError(f"a {quote} quote is never closed in {self.text!r}")

    def primitive(self, top: bool) -> Any:
        out: list[str] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == "\\" and self.i + 1 < len(self.text):
                out.append(self.text[self.i + 1])
                self.i += 2
                continue
            if not top and c in ",]}":
                break
            out.append(c)
            self.i += 1
        raw = "".join(out).strip()
        lowered = raw.lower()
        if lowered == "null":
            return None
        if lowered in ("true", "false"):
            return lowered == "true"
        if _INT.fullmatch(raw):
            return int(raw.replace("_", ""))
        if _FLOAT.fullmatch(raw):
            return float(raw.replace("_", ""))
        return _no_interpolation(raw, self.text)


def _no_interpolation(value: str, text: str) -> str:
    if "${" in value:
        raise OverrideError(
            f"{text!r} is a Hydra interpolation, which reads verl's own config; write the value"
        )
    return value
