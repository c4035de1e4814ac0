"""The reward-manager interface and the scoring kit: scoring functions found by data source,
scoring in worker processes or on Ray, the per-sample result and the metrics every manager
reports, and the judge-answer parser interface."""

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
