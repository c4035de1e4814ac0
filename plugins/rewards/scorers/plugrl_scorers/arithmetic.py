"""The quickstart's arithmetic task (data source ``plugrl/arithmetic``).

The answer is read by :func:`plugrl.api.rewards.parse_answer` (the last line that
opens with ``Answer:``, holding one integer; its docstring has the rules), the same function
that measures the quickstart's warm-start accuracy. Score 1.0 when the integer equals the
ground truth, else 0.0 (also when no answer parses). ``pred`` is the parsed integer written
plainly (``"1234"``), or ``None``.
"""

from __future__ import annotations

from typing import Any

from plugrl.api.rewards import ground_truth_value, parse_answer


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """1.0 when the last ``Answer:`` line holds the ground-truth integer, else 0.0."""
    truth = ground_truth_value(ground_truth)
    pred = parse_answer(solution_str)
    correct = pred is not None and pred == truth
    # pred as text, like the other scorers: a number here would be averaged into a metric
    return {
        "score": 1.0 if correct else 0.0,
        "acc": correct,
        "pred": None if pred is None else str(pred),
    }
