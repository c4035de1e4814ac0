"""Options of the ``word_guess`` environment, set in a recipe under
``rollout.agent.env_args``. Kept apart from the environment: checking a recipe and
``plugrl explain`` import only this module."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, non_negative, option
from plugrl.api.agents import EnvironmentConfig


def _below_solve_reward(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value >= instance.solve_reward:
        raise ConfigValueError(
            attribute.name,
            f"must be below solve_reward ({instance.solve_reward}), got {value!r}",
        )


@attrs.define(kw_only=True)
class WordGuessOptions(EnvironmentConfig):
    """``rollout.agent.env_args`` of the ``word_guess`` environment."""

    solve_reward: float = option(1.0, "Reward of the guess that finds the word.")
    letter_reward: float = option(
        0.0,
        "Reward of a wrong guess with every letter in its place; a wrong guess earns this "
        "times the fraction of its letters in place. Must be below solve_reward.",
        validator=attrs.validators.and_(non_negative, _below_solve_reward),
    )
    max_guesses: int = option(
        6,
        "Guesses before the word is revealed and the episode ends (rollout.agent.max_turns "
        "may end it sooner).",
        validator=non_negative,
    )
