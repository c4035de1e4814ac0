"""GSM8K (data source ``openai/gsm8k``), scored by default as verl 0.9.1 scores it
(``verl.utils.reward_score.gsm8k``), so reward curves compare one to one.

Only the response's final ``TAIL_CHARS`` characters are read. Two ways to find the answer
(``method``):

* ``strict`` (the default): the last ``#### N``, where ``####`` is followed by exactly one
  space and ``N`` is an optional ``-`` and a run of ASCII digits, periods and commas; the
  commas are then removed. ``####72``, ``#### $72``, ``####  72`` and ``#### +72`` have no
  answer; ``#### 72.`` reads ``72.``.
* ``flexible``: the last such run (optional ``-``, digits, periods, commas) anywhere in the
  tail that is not a lone ``.``, commas kept (if every run is a lone ``.``, the answer is
  ``.``).

The answer is compared with the ground truth as a string: ``72.0`` does not match ``72``.
Score ``score`` (1.0) when equal, ``format_score`` (0.0) when an answer was found but differs,
and 0.0 when there is no answer (whatever ``format_score`` is). The result also carries
``acc`` (bool) and ``pred`` (the answer string, or ``None``); verl returns the score alone.
A ground truth that is not a string is compared as its text.

``lenient=True`` is plugrl's earlier, more forgiving parse: a tail of ``LENIENT_TAIL_CHARS``
characters; ``strict`` takes ``####`` followed by any spaces and a number that may carry a sign
(``+``, ``-``, ``−``), ``$``, thousands commas and a trailing period; ``flexible`` takes the last
such number anywhere; the two are compared by value (``72``, ``72.0`` and ``$72`` all match a
ground truth of ``72``), and a ground truth that is not a number is an error.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

TAIL_CHARS = 300
"""Characters at the end of the response that are searched."""
LENIENT_TAIL_CHARS = 1000
"""The same, with ``lenient=True``."""
METHODS = ("strict", "flexible")

# verl's parse: ASCII digits only ("\d" would also take other scripts' digits)
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_RUN = re.compile(r"-?[0-9.,]+")

# the lenient parse
_NUMBER = r"[-+−]?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_LENIENT_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_LENIENT_NUMBER = re.compile(_NUMBER)


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer string ``method`` finds (verl's parse), or ``None``."""
    _check_method(method)
    tail = solution_str[-TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "") if found else None
    runs = _RUN.findall(tail)
    if not runs:
        return None
    return next((run for run in reversed(runs) if run != "."), ".")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    lenient: bool = False,
) -> dict[str, Any]:
    """``score`` when the answer equals the ground truth, ``format_score`` when it differs, 0.0
    without an answer (module docstring); ``lenient=True`` for the forgiving parse."""
    if lenient:
        return _lenient_score(solution_str, ground_truth, method, format_score, score)
    answer = extract_answer(solution_str, method)
    if answer is None:
        return {"score": 0.0, "acc": False, "pred": None}
    correct = answer == str(ground_truth)
    return {"score": float(score if correct else format_score), "acc": correct, "pred": answer}


def compute_score_flexible(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """GSM8K scored on the last number of the response (verl's ``flexible`` method)."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")


def compute_score_lenient(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """GSM8K with the forgiving parse: ``#### N`` compared by value (``lenient=True``)."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, lenient=True)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown gsm8k method {method!r}: use 'strict' or 'flexible'")


# ------------------------------------------------------------------------------ lenient


def to_number(text: str) -> Decimal | None:
    """``"$1,234.50"`` -> Decimal("1234.50"); ``None`` if it is not a number."""
    cleaned = text.strip().replace("−", "-").replace("$", "").replace(",", "").replace(" ", "")
    cleaned = cleaned.rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_lenient(solution_str: str, method: str = "strict") -> str | None:
    """The answer text the forgiving parse finds, or ``None``."""
    _check_method(method)
    tail = solution_str[-LENIENT_TAIL_CHARS:]
    if method == "strict":
        found = _LENIENT_STRICT.findall(tail)
    else:
        found = [m for m in _LENIENT_NUMBER.findall(tail) if to_number(m) is not None]
    return found[-1].strip() if found else None


def _lenient_score(
    solution_str: str, ground_truth: Any, method: str, format_score: float, score: float
) -> dict[str, Any]:
    truth = to_number(str(ground_truth))
    if truth is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number")
    answer = extract_lenient(solution_str, method)
    pred = to_number(answer) if answer is not None else None
    correct = pred is not None and pred == truth
    return {
        "score": float(score if correct else format_score),
        "acc": correct,
        "pred": None if pred is None else _plain(pred),
    }


def _plain(value: Decimal) -> str:
    """``Decimal("72.0")`` -> ``"72"``; keeps the prediction column readable."""
    return format(value.normalize(), "f")
