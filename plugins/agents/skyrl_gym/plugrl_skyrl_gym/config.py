"""Options of the ``skyrl_gym`` environment (``rollout.agent.env_args``); read without
importing skyrl-gym, which is imported only to check an ``env_id`` when it is installed."""

from __future__ import annotations

import importlib
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
        validator=lambda _, __, value: value is None or registered_env_id(value),
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


def registered_env_id(env_id: str) -> str:
    """The id skyrl-gym has ``env_id`` registered under: for ``"module:id"``, ``id``, once the
    module is imported (which registers it). Raises a one-line :class:`ValueError` naming the
    registered ids when there is no such environment; without skyrl-gym installed, returns
    the id unchecked (the plugin is then listed unavailable, with its install line)."""
    try:
        from skyrl_gym.envs.registration import registry
    except ImportError:
        return env_id.rpartition(":")[2]
    module, colon, name = env_id.rpartition(":")
    if colon:
        if not module or not name:
            raise ValueError(
                f"rollout.agent.env_args.env_id: {env_id!r} is not 'module:id' nor an id"
            )
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(
                f"rollout.agent.env_args.env_id: cannot import {module!r} to register "
                f"{name!r} ({exc})"
            ) from None
    if name in registry:
        return name
    where = f" after importing {module!r}" if colon else ""
    raise ValueError(
        f"rollout.agent.env_args.env_id: skyrl-gym has no environment {name!r}{where}; "
        f"registered: {', '.join(sorted(registry))} (or 'module:id' to import the module "
        "registering it)"
    )
