"""The ``calculator`` tool: one argument, ``expression``, such as ``347*812`` or
``(2.5 + 4) / 3``; the result comes back as text.

The expression is parsed with :mod:`ast` and walked by a small evaluator that knows numbers,
``+ - * / // % **`` and parentheses, nothing else: no names, calls or attributes, so nothing a
model writes can run code. Sizes are bounded so that one call stays microseconds: the text's
length, the digits of every number met on the way (``10**400`` and ``9**9**9`` are refused
before they are computed), and the nesting depth. A refused expression raises
:class:`~plugrl.parts.agent.ToolArgumentError`, whose one-line message the model sees.

Results: an integer result is written as an integer (``281764``); a decimal one with up to 12
significant digits (``0.333333333333``, ``2.5``), and a decimal that is whole as ``6.0``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from plugrl.api import option, positive
from plugrl.api.agents import Tool, ToolArgumentError, ToolConfig, ToolContext, ToolResult

Number = int | float

ALLOWED = "numbers, + - * / // % ** and parentheses"

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_SYMBOLS = {ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}


@attrs.define(kw_only=True)
class CalculatorConfig(ToolConfig):
    """``rollout.agent.tool_args.calculator``."""

    max_expression_length: int = option(
        200, "Characters of one expression at most.", validator=positive
    )
    max_digits: int = option(
        100,
        "Digits of any number in the computation at most (before the decimal point); "
        "larger ones, and powers that would make them, are refused.",
        validator=positive,
    )


def _digits(value: Number) -> int:
    """Digits before the decimal point (1 for numbers below 10 in size)."""
    size = abs(value)
    if size < 10:
        return 1
    if isinstance(size, int):
        return len(str(size))
    return math.floor(math.log10(size)) + 1


class _Evaluator:
    def __init__(self, max_digits: int, max_depth: int = 64) -> None:
        self.max_digits = max_digits
        self.max_depth = max_depth

    def checked(self, value: Number) -> Number:
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolArgumentError("expression: the result is not a finite number")
        if _digits(value) > self.max_digits:
            raise ToolArgumentError(
                f"expression: a number has more than {self.max_digits} digits; use smaller numbers"
            )
        return value

    def evaluate(self, node: ast.AST, depth: int = 0) -> Number:
        if depth > self.max_depth:
            raise ToolArgumentError(
                f"expression: nested more than {self.max_depth} deep; write it flatter"
            )
        if isinstance(node, ast.Expression):
            return self.evaluate(node.body, depth + 1)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ToolArgumentError(
                    f"expression: {value!r} is not a number; use only {ALLOWED}"
                )
            return self.checked(value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self.checked(_UNARY[type(node.op)](self.evaluate(node.operand, depth + 1)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left = self.evaluate(node.left, depth + 1)
            right = self.evaluate(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                self.check_power(left, right)
            try:
                return self.checked(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                symbol = _SYMBOLS.get(type(node.op), "/")
                raise ToolArgumentError(
                    f"expression: division by zero in {symbol}; divide by a number that is not 0"
                ) from None
            except OverflowError:
                raise ToolArgumentError(
                    "expression: the result is too large; use smaller numbers"
                ) from None
        raise ToolArgumentError(
            f"expression: {type(node).__name__} is not allowed; use only {ALLOWED}"
        )

    def check_power(self, base: Number, exponent: Number) -> None:
        """Refuse a power whose result would pass ``max_digits`` before computing it."""
        if base == 0 and exponent < 0:
            raise ToolArgumentError(
                "expression: 0 to a negative power is undefined; use a positive exponent"
            )
        if isinstance(base, int | float) and base < 0 and not float(exponent).is_integer():
            raise ToolArgumentError(
                "expression: a negative number to a fractional power is not a real number"
            )
        if abs(base) <= 1 or exponent <= 0:
            return
        if exponent * math.log10(abs(base)) >= self.max_digits:
            raise ToolArgumentError(
                f"expression: the power has more than {self.max_digits} digits; "
                "use a smaller base or exponent"
            )


def evaluate(expression: str, *, max_length: int = 200, max_digits: int = 100) -> Number:
    """The value of ``expression``; :class:`ToolArgumentError` for one that is not arithmetic
    or passes the bounds."""
    if not isinstance(expression, str):
        raise ToolArgumentError(
            f'expression must be a string such as "347*812", not {type(expression).__name__}'
        )
    text = expression.strip()
    if not text:
        raise ToolArgumentError('expression is empty; write one such as "347*812"')
    if len(text) > max_length:
        raise ToolArgumentError(
            f"expression has {len(text)} characters, more than {max_length}; shorten it"
        )
    if "_" in text:
        # Python reads 1_000 as 1000; a calculator should not
        raise ToolArgumentError(f"expression: '_' is not allowed; use only {ALLOWED}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolArgumentError(
            f"expression {text!r} is not arithmetic; use only {ALLOWED}"
        ) from None
    return _Evaluator(max_digits).evaluate(tree)


def format_number(value: Number) -> str:
    """``281764``, ``2.5``, ``0.333333333333``, ``6.0``."""
    if isinstance(value, int):
        return str(value)
    text = f"{value:.12g}"
    if "e" not in text and "." not in text:
        text += ".0"
    return text


class Calculator(Tool):
    """Evaluates one arithmetic expression; see the module docstring for what it accepts."""

    name = "calculator"
    config: CalculatorConfig

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": f"Evaluate an arithmetic expression ({ALLOWED}).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {
                            "type": "string",
                            "description": "The expression, such as 347*812.",
                        }
                    },
                    "required": ["expression"],
                },
            },
        }

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        # evaluated inline, not in a worker process: the bounds keep one call to microseconds
        unknown = sorted(set(arguments) - {"expression"})
        if unknown:
            raise ToolArgumentError(
                f'calculator takes only "expression", not {", ".join(map(repr, unknown))}'
            )
        if "expression" not in arguments:
            raise ToolArgumentError('calculator needs "expression", such as "347*812"')
        value = evaluate(
            arguments["expression"],
            max_length=self.config.max_expression_length,
            max_digits=self.config.max_digits,
        )
        return ToolResult(text=format_number(value))
