"""The ``calculator`` tool: arithmetic on integers and decimals, evaluated safely."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_tools(register):
    register(
        "calculator",
        "plugrl_calculator.calculator:Calculator",
        config="plugrl_calculator.calculator:CalculatorConfig",
        description="evaluates + - * / // % ** and parentheses on integers and decimals",
    )
