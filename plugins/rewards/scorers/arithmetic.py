"""The quickstart's arithmetic task (data source ``plugrl/arithmetic``).

Parsing, exactly:

1. Lines are scanned for one that starts (after spaces) with ``Answer:`` in any case, ASCII or
   full-width colon. The **last** such line is the answer; text elsewhere is ignored, and an
   invalid last answer is not rescued by a valid earlier one.
2. Its value is the rest of the line with surrounding spaces and one trailing period removed.
3. The value must be one integer: optional sign (``+``, ``-``, ``−``), digits, optionally
   grouped in threes by commas (``1,234``). Decimals (``3.0``), fractions, words and several
   numbers are rejected.

Score 1.0 when the integer equals the ground truth, else 0.0 (also when no answer parses).
``pred`` is the parsed integer written plainly (``"1234"``), or ``None``.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

from plugrl_plugins.rewards.scorers.extract import last_answer_line, parse_integer


def parse_answer(solution_str: str) -> int | None:
    """The integer of the last ``Answer:`` line, or ``None``."""
    value = last_answer_line(solution_str, line_start=True)
    return None if value is None else parse_integer(value)


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """1.0 when the last ``Answer:`` line holds the ground-truth integer, else 0.0."""
    truth = ground_truth if isinstance(ground_truth, Integral) else parse_integer(str(ground_truth))
    if truth is None or isinstance(truth, bool):
        raise ValueError(f"ground truth {ground_truth!r} is not an integer")
    pred = parse_answer(solution_str)
    correct = pred is not None and pred == truth
    # pred as text, like the other scorers: a number here would be averaged into a metric
    return {
        "score": 1.0 if correct else 0.0,
        "acc": correct,
        "pred": None if pred is None else str(pred),
    }
