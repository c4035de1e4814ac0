"""Multiple choice (data source ``multiple_choice``, and ``cais/mmlu``, ``Idavidrein/gpqa``,
``TIGER-Lab/MMLU-Pro``): a letter, boxed or on an ``Answer:`` line.

The prediction is the letter in the last ``\\boxed{...}`` (``\\boxed{B}``, ``\\boxed{(B)}``,
``\\boxed{\\text{B}}``, ``\\boxed{B. Paris}``); without a box, the letter that opens the last
``Answer:`` line. The ground truth is a letter, or a 0-based option index (``2`` is ``C``).
Score 1.0 when the letters match, else 0.0.
"""

from __future__ import annotations

import re
import string
from numbers import Integral
from typing import Any

from plugrl_scorers.extract import last_answer_line, last_boxed

_LETTER = re.compile(r"^\(?([A-Z])(?:\)|\.|:|\s|$)")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def parse_choice(text: str) -> str | None:
    """The option letter that opens ``text`` (``(B)``, ``B.``, ``B) Paris``), or ``None``."""
    cleaned = _TEXT_WRAPPER.sub(r"\1", text).strip().strip("*$ ")
    match = _LETTER.match(cleaned)
    return match.group(1) if match else None


def truth_letter(ground_truth: Any) -> str:
    """``"b"``, ``"B"``, ``"(B)"`` or ``1`` -> ``"B"``."""
    if isinstance(ground_truth, Integral) and not isinstance(ground_truth, bool):
        if 0 <= ground_truth < len(string.ascii_uppercase):
            return string.ascii_uppercase[ground_truth]
    elif isinstance(ground_truth, str):
        letter = parse_choice(ground_truth.strip().upper())
        if letter:
            return letter
    raise ValueError(f"ground truth {ground_truth!r} is not an option letter or 0-based index")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """1.0 when the chosen letter is the ground truth's, else 0.0."""
    truth = truth_letter(ground_truth)
    boxed = last_boxed(solution_str)
    if boxed is not None:
        pred = parse_choice(boxed)
    else:
        line = last_answer_line(solution_str)
        pred = parse_choice(line) if line is not None else None
    correct = pred == truth
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": pred}
