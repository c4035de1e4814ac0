"""The reward-manager interface and the scoring kit: scoring functions found by data source,
scoring in worker processes or on Ray, the per-sample result and the metrics every manager
reports, and the judge-answer parser interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.parts.judge import JudgeParser
    from plugrl.parts.reward import (
        BatchScoringFunction,
        CustomFunctionConfig,
        RewardConfig,
        RewardManager,
        RewardOutput,
        ScoringFunction,
        expect_config,
    )
    from plugrl.parts.scoring import Scorer, ScoringError
    from plugrl.rewards.answers import ANSWER_LABEL, ground_truth_value, parse_answer, parse_integer
    from plugrl.rewards.results import SampleResult, extra_columns, score_metrics
    from plugrl.rewards.workers import (
        LOAD_TIMEOUT_S,
        Call,
        Outcome,
        ProcessPool,
        check_pool_size,
        run_call,
    )

__all__ = [
    "ANSWER_LABEL",
    "LOAD_TIMEOUT_S",
    "BatchScoringFunction",
    "Call",
    "CustomFunctionConfig",
    "JudgeParser",
    "Outcome",
    "ProcessPool",
    "RewardConfig",
    "RewardManager",
    "RewardOutput",
    "SampleResult",
    "Scorer",
    "ScoringError",
    "ScoringFunction",
    "check_pool_size",
    "expect_config",
    "extra_columns",
    "ground_truth_value",
    "parse_answer",
    "parse_integer",
    "run_call",
    "score_metrics",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "ANSWER_LABEL": ("plugrl.rewards.answers", "ANSWER_LABEL"),
        "LOAD_TIMEOUT_S": ("plugrl.rewards.workers", "LOAD_TIMEOUT_S"),
        "BatchScoringFunction": ("plugrl.parts.reward", "BatchScoringFunction"),
        "Call": ("plugrl.rewards.workers", "Call"),
        "CustomFunctionConfig": ("plugrl.parts.reward", "CustomFunctionConfig"),
        "JudgeParser": ("plugrl.parts.judge", "JudgeParser"),
        "Outcome": ("plugrl.rewards.workers", "Outcome"),
        "ProcessPool": ("plugrl.rewards.workers", "ProcessPool"),
        "RewardConfig": ("plugrl.parts.reward", "RewardConfig"),
        "RewardManager": ("plugrl.parts.reward", "RewardManager"),
        "RewardOutput": ("plugrl.parts.reward", "RewardOutput"),
        "SampleResult": ("plugrl.rewards.results", "SampleResult"),
        "Scorer": ("plugrl.parts.scoring", "Scorer"),
        "ScoringError": ("plugrl.parts.scoring", "ScoringError"),
        "ScoringFunction": ("plugrl.parts.reward", "ScoringFunction"),
        "check_pool_size": ("plugrl.rewards.workers", "check_pool_size"),
        "expect_config": ("plugrl.parts.reward", "expect_config"),
        "extra_columns": ("plugrl.rewards.results", "extra_columns"),
        "ground_truth_value": ("plugrl.rewards.answers", "ground_truth_value"),
        "parse_answer": ("plugrl.rewards.answers", "parse_answer"),
        "parse_integer": ("plugrl.rewards.answers", "parse_integer"),
        "run_call": ("plugrl.rewards.workers", "run_call"),
        "score_metrics": ("plugrl.rewards.results", "score_metrics"),
    },
)
