"""Options of the ``skyrl_gym`` environment (``rollout.agent.env_args``); read without
importing skyrl-gym."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import option
from plugrl.api.agents import EnvironmentConfig


@attrs.define(kw_only=True)
class SkyrlGymConfig(EnvironmentConfig):
    """Which skyrl-gym environment, and what it is made with."""

    env_id: str | None = option(
        None,
        "The skyrl-gym environment id (skyrl_gym.make's id: gsm8k, gsm8k_multi_turn, aime, "
        "or 'module:id' to import the module that registers it); unset: each row's env_class "
        "column, as SkyRL's datasets have it.",
    )
    env_config: dict[str, Any] = option(
        factory=dict,
        help="The environment's env_config (SkyRL's skyrl_gym_config.<env id> section).",
    )
    extras: dict[str, Any] = option(
        factory=dict,
        help="Extras every episode is made with; a row's own columns (reward_spec, "
        "extra_info, ...) take precedence.",
    )
