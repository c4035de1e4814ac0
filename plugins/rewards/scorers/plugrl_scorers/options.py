"""Options of the built-in scoring functions, set in a recipe under
``reward.function_args.<registered name>``. Kept apart from the scorers so that checking a
recipe imports none of them."""

from __future__ import annotations

import attrs

from plugrl.api import option


@attrs.define(kw_only=True)
class Gsm8kOptions:
    """``reward.function_args.openai/gsm8k``."""

    method: str = option(
        "strict",
        "strict: the number after '#### ' (verl's default); flexible: the last number anywhere.",
        choices=["strict", "flexible"],
    )
    score: float = option(1.0, "Score of a correct answer.")
    format_score: float = option(
        0.0, "Score of a wrong answer (a response with no answer at all scores 0)."
    )
    lenient: bool = option(
        False,
        "plugrl's forgiving parse: signs, '$', trailing periods, compared by value, in the last "
        "1000 characters (curves then no longer compare with verl's).",
    )


@attrs.define(kw_only=True)
class MathDapoOptions:
    """``reward.function_args.<math_dapo|math|aime*>``."""

    strict_box_verify: bool = option(
        False, "Read the answer only from the last \\\\boxed{} (verl's strict_box_verify)."
    )
