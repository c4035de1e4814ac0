"""LLM judges: the ``judge`` reward manager, which asks a frozen model served by a rollout
engine to score each response, and the score parsers that read its answers (``rating``,
``number``, ``yes_no``, ``boxed``).

Registered by path, so nothing here imports torch until a run chooses the judge.
"""

from __future__ import annotations

from plugrl.api import hookimpl

_MANAGER = "plugrl_judge.manager"
_PARSERS = "plugrl_judge.parsers"


@hookimpl
def register_reward_managers(register):
    register(
        "judge",
        f"{_MANAGER}:JudgeRewardManager",
        config=f"{_MANAGER}:JudgeRewardConfig",
        description="A frozen LLM judge, served by a rollout engine, scores each response",
    )


@hookimpl
def register_judge_parsers(register):
    register("rating", f"{_PARSERS}:rating", description="'Rating: [[7]]' or 'Score: 7'")
    register("number", f"{_PARSERS}:number", description="The last number in the answer")
    register("yes_no", f"{_PARSERS}:yes_no", description="1 for yes, 0 for no (the first)")
    register("boxed", f"{_PARSERS}:boxed", description="The number in the last \\boxed{...}")


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_judge.memory import estimate_memory as judge_terms

    return judge_terms(recipe, role, shape, context)
