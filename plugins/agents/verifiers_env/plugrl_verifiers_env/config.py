"""Options of the ``verifiers`` environment (``rollout.agent.env_args``); read without
importing verifiers."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, option
from plugrl.api.agents import EnvironmentConfig


def _not_empty(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if not value:
        raise ConfigValueError(
            attribute.name,
            "name the verifiers environment: an installed environment's id, a module with a "
            "load_environment function, or 'module:function'",
        )


@attrs.define(kw_only=True)
class VerifiersConfig(EnvironmentConfig):
    """Which verifiers environment, and what it is loaded with."""

    environment: str = option(
        "",
        "The verifiers environment: 'module:function' (a function returning the "
        "environment), or an environment id or module name, loaded by verifiers' "
        "load_environment.",
        validator=_not_empty,
    )
    args: dict[str, Any] = option(
        factory=dict, help="Keyword arguments of the environment's load function."
    )
