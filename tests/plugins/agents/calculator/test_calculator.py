from __future__ import annotations

import asyncio

import pytest

from plugrl.parts.agent import ToolArgumentError, ToolContext, ToolResult
from plugrl_calculator.calculator import Calculator, CalculatorConfig, evaluate, format_number


def _call(arguments, config=None):
    tool = Calculator(config or CalculatorConfig(), None)
    context = ToolContext(row={}, sample_id="u/0")
    return asyncio.run(tool.call(arguments, context))


@pytest.mark.parametrize(
    ("expression", "text"),
    [
        ("347*812", "281764"),
        (" 347 * 812 ", "281764"),
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2.0"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("-3 + +2", "-1"),
        ("1.5 * 4", "6.0"),
        ("1 / 3", "0.333333333333"),
        ("10 ** 99", "1" + "0" * 99),
        ("9 ** 0.5", "3.0"),
    ],
)
def test_evaluates_arithmetic(expression, text):
    assert format_number(evaluate(expression)) == text
    assert _call({"expression": expression}) == ToolResult(text=text)


def test_schema_names_the_one_argument():
    schema = Calculator(CalculatorConfig(), None).schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert set(function["parameters"]["properties"]) == {"expression"}


def test_the_tool_is_registered():
    from plugrl.plugin.manager import get_plugin_manager

    entry = get_plugin_manager().registry("tools").get("calculator")
    assert entry.plugin == "calculator"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "expression: '_' is not allowed; use only numbers"),
        ("abs(-3)", "expression: Call is not allowed; use only numbers"),
        ("x + 1", "expression: Name is not allowed; use only numbers"),
        ("(1).real", "expression: Attribute is not allowed"),
        ("1 < 2", "expression: Compare is not allowed"),
        ("1 << 2", "expression: BinOp is not allowed"),
        ("~1", "expression: UnaryOp is not allowed"),
        ("'3' * 3", "expression: '3' is not a number; use only numbers"),
        ("True + 1", "expression: True is not a number"),
        ("2j", "expression: 2j is not a number"),
        ("347 x 812", "expression '347 x 812' is not arithmetic; use only numbers"),
        ("", 'expression is empty; write one such as "347*812"'),
        ("1/0", "expression: division by zero in /; divide by a number that is not 0"),
        ("1//0", "expression: division by zero in //"),
        ("1%0", "expression: division by zero in %"),
        ("0 ** -1", "expression: 0 to a negative power is undefined; use a positive exponent"),
        ("(-8) ** 0.5", "expression: a negative number to a fractional power is not a real"),
        ("10 ** 100", "expression: the power has more than 100 digits; use a smaller base"),
        ("9 ** 9 ** 9", "expression: the power has more than 100 digits"),
        ("2.0 ** 5000", "expression: the power has more than 100 digits"),
        ("1" * 101, "expression: a number has more than 100 digits; use smaller numbers"),
        ("1e300", "expression: a number has more than 100 digits"),
        ("10**99 * 10**99", "expression: a number has more than 100 digits"),
        ("1" + "+1" * 100, "expression has 201 characters, more than 200; shorten it"),
        ("-" * 70 + "1", "expression: nested more than 64 deep; write it flatter"),
    ],
)
def test_refuses_what_is_not_bounded_arithmetic(expression, message):
    with pytest.raises(ToolArgumentError) as raised:
        _call({"expression": expression})
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_float_overflow_is_refused():
    # only reachable with bounds past what a float holds
    with pytest.raises(ToolArgumentError, match=r"^expression: the result is too large; use"):
        evaluate("10.0 ** 400", max_digits=1000)
    with pytest.raises(ToolArgumentError, match=r"^expression: the result is not a finite number$"):
        evaluate("1e300 * 1e300", max_digits=1000)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, 'calculator needs "expression", such as "347*812"'),
        ({"expr": "1+1"}, "calculator takes only \"expression\", not 'expr'"),
        ({"expression": 3}, 'expression must be a string such as "347*812", not int'),
    ],
)
def test_refuses_arguments_that_do_not_fit_the_schema(arguments, message):
    with pytest.raises(ToolArgumentError) as raised:
        _call(arguments)
    assert str(raised.value) == message


def test_bounds_come_from_the_config():
    config = CalculatorConfig(max_expression_length=5, max_digits=3)
    with pytest.raises(ToolArgumentError, match="more than 5; shorten it"):
        _call({"expression": "100000"}, config)
    with pytest.raises(ToolArgumentError, match="more than 3 digits"):
        _call({"expression": "99*99"}, config)
    assert _call({"expression": "9*9"}, config).text == "81"


def test_config_bounds_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        CalculatorConfig(max_digits=0)
