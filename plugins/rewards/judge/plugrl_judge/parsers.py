"""The built-in score parsers of LLM judges: each reads the score out of a judge's answer, or
returns ``None`` when the answer holds none in its form (the judge is then asked again)."""

from __future__ import annotations

import math
import re

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_DOUBLE_BRACKETS = re.compile(rf"\[\[\s*({_NUMBER})\s*\]\]")
_LABELLED = re.compile(rf"\b(?:rating|score)\s*[:=]\s*\[?\s*({_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_BOXED = "\\boxed{"
_FRACTION = re.compile(rf"^({_NUMBER})\s*/\s*({_NUMBER})$")
_LATEX_FRACTION = re.compile(rf"^\\[dt]?frac\{{\s*({_NUMBER})\s*\}}\{{\s*({_NUMBER})\s*\}}$")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def rating(text: str) -> float | None:
    """The MT-Bench form: the last ``[[N]]`` in the answer (``Rating: [[7]]``); without one,
    the last ``Rating: N`` or ``Score: N`` (any case)."""
    for pattern in (_DOUBLE_BRACKETS, _LABELLED):
        found = pattern.findall(text)
        if found:
            return _finite(float(found[-1]))
    return None


def number(text: str) -> float | None:
    """The last number in the answer (``7``, ``-1.5``, ``.25``)."""
    found = _ANY_NUMBER.findall(text)
    return _finite(float(found[-1])) if found else None


def yes_no(text: str) -> float | None:
    """1 for ``yes``, 0 for ``no``: the first of the two words in the answer, in any case
    (ask the judge to answer with it first)."""
    found = _YES_NO.search(text)
    if found is None:
        return None
    return 1.0 if found.group(1).lower() == "yes" else 0.0


def boxed(text: str) -> float | None:
    """The number in the last ``\\boxed{...}`` of the answer: ``\\boxed{7}``, a fraction
    ``\\boxed{3/4}`` or ``\\boxed{\\frac{3}{4}}``; ``None`` when the box holds anything
    else."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, position = 1, start + len(_BOXED)
    content_start = position
    while position < len(text):
        char = text[position]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return _as_number(text[content_start:position].strip())
        position += 1
    return None  # the box never closes


def _as_number(content: str) -> float | None:
    if re.fullmatch(_NUMBER, content):
        return _finite(float(content))
    for pattern in (_FRACTION, _LATEX_FRACTION):
        match = pattern.match(content)
        if match:
            denominator = float(match.group(2))
            return None if denominator == 0 else _finite(float(match.group(1)) / denominator)
    return None
