"""The options of the ``countdown`` reward function, set in a recipe under
``reward.function_args.countdown``. Kept apart from the scorer: checking a recipe and
``plugrl explain`` import only this module."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, non_negative, option


def _below_correct_score(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value >= instance.correct_score:
        raise ConfigValueError(
            attribute.name,
            f"must be below correct_score ({instance.correct_score}), got {value!r}",
        )


@attrs.define(kw_only=True)
class CountdownOptions:
    """``reward.function_args.countdown``."""

    correct_score: float = option(1.0, "Score of a correct equation.")
    format_score: float = option(
        0.1,
        "Score of an equation in the <answer> tag that is wrong (value, numbers or syntax); "
        "a response with no tag scores 0.",
        validator=attrs.validators.and_(non_negative, _below_correct_score),
    )
    use_all_numbers: bool = option(
        True,
        "Every given number must be used exactly once; false: each at most once (some may be "
        "left out).",
    )
