"""Built-in rewards: reward managers (``naive``, ``dapo``, ``batch``, ``parallel``) and scoring
functions by data source. Everything is registered by path, so nothing here imports torch or
a scorer's libraries until a run chooses it.
"""

from __future__ import annotations

import plugrl

_SCORERS = "plugrl_plugins.rewards.scorers"
_MANAGERS = "plugrl_plugins.rewards.managers"

# data source (or glob pattern) -> (scoring function, description)
REWARD_FUNCTIONS: dict[str, tuple[str, str]] = {
    "openai/gsm8k": (
        f"{_SCORERS}.gsm8k:compute_score",
        "GSM8K: the number after '#### ' (verl's strict parse)",
    ),
    "math_dapo": (
        f"{_SCORERS}.math_dapo:compute_score",
        "DAPO maths: 'Answer: X' (else a box), +1/-1",
    ),
    "math": (f"{_SCORERS}.math_dapo:compute_score", "DAPO maths: 'Answer: X' (else a box), +1/-1"),
    "aime*": (
        f"{_SCORERS}.math_dapo:compute_score",
        "AIME, DAPO style: 'Answer: X' (else a box), +1/-1",
    ),
    "lighteval/MATH": (f"{_SCORERS}.math_boxed:compute_score", "MATH: boxed answer"),
    "DigitalLearningGmbH/MATH-lighteval": (
        f"{_SCORERS}.math_boxed:compute_score",
        "MATH: boxed answer",
    ),
    "HuggingFaceH4/MATH-500": (f"{_SCORERS}.math_boxed:compute_score", "MATH-500: boxed answer"),
    "multiple_choice": (
        f"{_SCORERS}.multiple_choice:compute_score",
        "Multiple choice: boxed letter",
    ),
    "cais/mmlu": (f"{_SCORERS}.multiple_choice:compute_score", "MMLU: boxed letter"),
    "TIGER-Lab/MMLU-Pro": (f"{_SCORERS}.multiple_choice:compute_score", "MMLU-Pro: boxed letter"),
    "Idavidrein/gpqa": (f"{_SCORERS}.multiple_choice:compute_score", "GPQA: boxed letter"),
    "plugrl/arithmetic": (
        f"{_SCORERS}.arithmetic:compute_score",
        "Quickstart arithmetic: last 'Answer: <integer>' line",
    ),
}


# scoring functions that take options from the recipe (reward.function_args.<name>)
FUNCTION_OPTIONS: dict[str, str] = {
    "openai/gsm8k": "plugrl_plugins.rewards.options:Gsm8kOptions",
    "math_dapo": "plugrl_plugins.rewards.options:MathDapoOptions",
    "math": "plugrl_plugins.rewards.options:MathDapoOptions",
    "aime*": "plugrl_plugins.rewards.options:MathDapoOptions",
}


@plugrl.hookimpl
def register_reward_functions(register):
    for data_source, (target, description) in REWARD_FUNCTIONS.items():
        register(
            data_source,
            target,
            config=FUNCTION_OPTIONS.get(data_source),
            description=description,
        )


@plugrl.hookimpl
def register_reward_managers(register):
    register(
        "naive",
        f"{_MANAGERS}:NaiveRewardManager",
        description="One call per sample; the score on the last response token",
    )
    register(
        "dapo",
        f"{_MANAGERS}:DAPORewardManager",
        config=f"{_MANAGERS}:DAPORewardConfig",
        description="naive plus DAPO's overlong buffer penalty",
    )
    register(
        "batch",
        f"{_MANAGERS}:BatchRewardManager",
        config=f"{_MANAGERS}:BatchRewardConfig",
        description="One call per scoring function for the whole batch",
    )
    register(
        "parallel",
        f"{_MANAGERS}:ParallelRewardManager",
        config=f"{_MANAGERS}:ParallelRewardConfig",
        description="Per-sample scoring in a pool of processes or Ray actors",
    )
