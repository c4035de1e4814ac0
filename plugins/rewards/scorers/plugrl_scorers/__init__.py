"""Scoring functions by data source, verl's rule scorers: GSM8K, DAPO maths, boxed maths,
multiple choice, and the quickstarts' arithmetic and counting.

Registered by path, so nothing here imports a scorer's libraries until a run scores its data.
"""

from __future__ import annotations

from plugrl.api import hookimpl

_PKG = "plugrl_scorers"

# data source (or glob pattern) -> (scoring function, description)
REWARD_FUNCTIONS: dict[str, tuple[str, str]] = {
    "openai/gsm8k": (
        f"{_PKG}.gsm8k:compute_score",
        "GSM8K: the number after '#### ' (verl's strict parse)",
    ),
    "math_dapo": (
        f"{_PKG}.math_dapo:compute_score",
        "DAPO maths: 'Answer: X' (else a box), +1/-1",
    ),
    "math": (f"{_PKG}.math_dapo:compute_score", "DAPO maths: 'Answer: X' (else a box), +1/-1"),
    "aime*": (
        f"{_PKG}.math_dapo:compute_score",
        "AIME, DAPO style: 'Answer: X' (else a box), +1/-1",
    ),
    "lighteval/MATH": (f"{_PKG}.math_boxed:compute_score", "MATH: boxed answer"),
    "DigitalLearningGmbH/MATH-lighteval": (
        f"{_PKG}.math_boxed:compute_score",
        "MATH: boxed answer",
    ),
    "HuggingFaceH4/MATH-500": (f"{_PKG}.math_boxed:compute_score", "MATH-500: boxed answer"),
    "multiple_choice": (
        f"{_PKG}.multiple_choice:compute_score",
        "Multiple choice: boxed letter",
    ),
    "cais/mmlu": (f"{_PKG}.multiple_choice:compute_score", "MMLU: boxed letter"),
    "TIGER-Lab/MMLU-Pro": (f"{_PKG}.multiple_choice:compute_score", "MMLU-Pro: boxed letter"),
    "Idavidrein/gpqa": (f"{_PKG}.multiple_choice:compute_score", "GPQA: boxed letter"),
    "plugrl/arithmetic": (
        f"{_PKG}.arithmetic:compute_score",
        "Quickstart arithmetic: last 'Answer: <integer>' line",
    ),
    "plugrl/counting": (
        f"{_PKG}.counting:compute_score",
        "Quickstart vision counting: last 'Answer: <integer>' line; names the row's picture",
    ),
}


# scoring functions that take options from the recipe (reward.function_args.<name>)
FUNCTION_OPTIONS: dict[str, str] = {
    "openai/gsm8k": "plugrl_scorers.options:Gsm8kOptions",
    "math_dapo": "plugrl_scorers.options:MathDapoOptions",
    "math": "plugrl_scorers.options:MathDapoOptions",
    "aime*": "plugrl_scorers.options:MathDapoOptions",
}


@hookimpl
def register_reward_functions(register):
    for data_source, (target, description) in REWARD_FUNCTIONS.items():
        register(
            data_source,
            target,
            config=FUNCTION_OPTIONS.get(data_source),
            description=description,
        )
