"""GSM8K (data source ``openai/gsm8k``): the number after ``####``, or the last number.

* ``strict`` (the default, as in GSM8K's own answer format): the last ``#### N`` in the
  response. ``N`` may carry a sign, ``$``, thousands commas and a trailing period.
* ``flexible``: the last number anywhere in the response.

Numbers are compared by value (``72``, ``72.0`` and ``$72`` all match a ground truth of
``72``). Score 1.0 when equal, else ``format_score`` (0.0 by default).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_NUMBER = r"[-+−]?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)
# Responses can be long; the final answer sits at the end (a bound also keeps regex time flat).
TAIL_CHARS = 1000


def to_number(text: str) -> Decimal | None:
    """``"$1,234.50"`` -> Decimal("1234.50"); ``None`` if it is not a number."""
    cleaned = text.strip().replace("−", "-").replace("$", "").replace(",", "").replace(" ", "")
    cleaned = cleaned.rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer text the chosen method finds, or ``None``."""
    tail = solution_str[-TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
    elif method == "flexible":
        found = [m for m in _ANY_NUMBER.findall(tail) if to_number(m) is not None]
    else:
        raise ValueError(f"unknown gsm8k method {method!r}: use 'strict' or 'flexible'")
    return found[-1].strip() if found else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``score`` when the extracted number equals the ground truth, else ``format_score``."""
    truth = to_number(str(ground_truth))
    if truth is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number")
    answer = extract_answer(solution_str, method)
    pred = to_number(answer) if answer is not None else None
    correct = pred is not None and pred == truth
    return {
        "score": score if correct else format_score,
        "acc": correct,
        "pred": None if pred is None else _plain(pred),
    }


def compute_score_flexible(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """GSM8K scored on the last number of the response."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")


def _plain(value: Decimal) -> str:
    """``Decimal("72.0")`` -> ``"72"``; keeps the prediction column readable."""
    return format(value.normalize(), "f")
