"""The ``calculator`` tool: arithmetic on integers and decimals, evaluated safely."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_tools(register):
    register(
        "calculator",
        "plugrl_calculator.calculator:Calculator",
        config="plugrl_calculator.calculator:CalculatorConfig",
        description="evaluates + - * / // % ** and parentheses on integers and decimals",
    )
