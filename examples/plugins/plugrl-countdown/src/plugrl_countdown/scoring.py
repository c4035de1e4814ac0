"""Scoring of Countdown answers, with a parser that accepts arithmetic only."""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any

FORMAT_SCORE = 0.1
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class NotArithmetic(ValueError):
    """The text is not an expression of integers, + - * / and parentheses."""


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Value of an arithmetic expression (exact, as a fraction) and the integers it uses."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise NotArithmetic(f"not an expression: {expression!r}") from exc
    numbers: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise NotArithmetic("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise NotArithmetic(f"only integers, + - * / and parentheses: {expression!r}")

    return walk(tree.body), numbers


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    correct_score: float = 1.0,
    format_score: float = FORMAT_SCORE,
    use_all_numbers: bool = True,
) -> dict[str, Any]:
    """verl-compatible scorer: ``correct_score`` for a correct equation, ``format_score`` for
    an equation in the tag that is wrong, 0.0 for no answer.

    The keyword arguments are the options of ``reward.function_args.countdown``
    (:class:`plugrl_countdown.options.CountdownOptions`); plugrl passes them all.
    """
    target = ground_truth["target"]
    allowed = Counter(int(n) for n in ground_truth["numbers"])
    answers = ANSWER_TAG.findall(solution_str)
    if not answers:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    expression = answers[-1]
    try:
        value, used = evaluate(expression)
    except NotArithmetic:
        return {"score": format_score, "acc": 0.0, "pred": expression.strip()}
    counted = Counter(used)
    numbers_ok = counted == allowed if use_all_numbers else counted <= allowed
    correct = numbers_ok and value == target
    return {
        "score": correct_score if correct else format_score,
        "acc": 1.0 if correct else 0.0,
        "pred": expression.strip(),
    }
