"""Score parsers of LLM judges: what ``register_judge_parsers`` registers."""

from __future__ import annotations

from typing import Protocol


class JudgeParser(Protocol):
    """A score parser, what ``register_judge_parsers`` registers: a plain function that reads
    the score out of a judge model's answer. Registered with ``config=`` (an attrs class), it
    also gets the options of ``reward.judge.parser_args``, checked by that class, as keyword
    arguments."""

    def __call__(self, text: str) -> float | None:
        """The score the judge's answer ``text`` gives, or ``None`` when the answer holds no
        score in the expected form (the judge is asked again, up to
        ``reward.judge.max_retries`` times)."""
        ...
