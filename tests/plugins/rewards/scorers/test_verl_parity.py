"""plugrl's ``math_dapo`` and ``gsm8k`` scorers give exactly verl's results on a table of tricky
responses. The expected values were produced by running verl's own scorers
(``freeze_verl_scores.py`` in this folder; verl is not needed to run these tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugrl_scorers import gsm8k, math_dapo

FROZEN = json.loads((Path(__file__).parent / "data" / "verl_scores.json").read_text("utf-8"))


def _label(case: dict) -> str:
    text = case["solution_str"]
    shown = text if len(text) <= 40 else f"...{text[-37:]}"
    options = ",".join(f"{k}={v}" for k, v in case["kwargs"].items())
    return f"{shown!r}|{case['ground_truth']!r}|{options}"


def test_the_table_is_verl_0_9_1_and_large_enough():
    assert FROZEN["verl_version"] == "0.9.1"
    assert len(FROZEN["math_dapo"]) >= 60
    assert len({c["solution_str"] for c in FROZEN["gsm8k"]}) >= 60


@pytest.mark.parametrize("case", FROZEN["math_dapo"], ids=_label)
def test_math_dapo_scores_as_verl(case):
    for data_source in ("math_dapo", "math", "aime2024"):
        result = math_dapo.compute_score(
            data_source, case["solution_str"], case["ground_truth"], None, **case["kwargs"]
        )
        assert result == case["expected"]
        assert type(result["score"]) is float and type(result["acc"]) is bool


@pytest.mark.parametrize("case", FROZEN["gsm8k"], ids=_label)
def test_gsm8k_scores_as_verl(case):
    result = gsm8k.compute_score(
        "openai/gsm8k", case["solution_str"], case["ground_truth"], None, **case["kwargs"]
    )
    assert result == case["expected"]
    assert type(result["score"]) is float and type(result["acc"]) is bool


def test_the_registered_gsm8k_scorer_is_verl_strict_by_default():
    strict = [c for c in FROZEN["gsm8k"] if c["kwargs"] == {"method": "strict"}]
    assert len(strict) >= 60
    for case in strict:
        result = gsm8k.compute_score("openai/gsm8k", case["solution_str"], case["ground_truth"])
        assert result == case["expected"], _label(case)
