"""The sections of ``reward.components``, read from a recipe: each component's keys (its
``weight`` and ``manager``, and its manager's reward keys, the top-level ones inherited), checked
with one-line errors keyed ``reward.components.<name>.<key>``. The combined manager that scores
with them is :class:`plugrl.rewards.components.WeightedRewardComponents`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.config import option
from plugrl.config.structuring import describe_value, fields_of, structure
from plugrl.errors import PlugrlError, RecipeError
from plugrl.parts.reward import RewardConfig
from plugrl.parts.scoring import function_options

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager

COMPONENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
"""A component's name: it becomes a metric path segment and a column name."""

RESERVED_NAMES = frozenset({"errors", "timeouts"})
"""Names whose ``reward/<name>`` metrics the combination itself logs."""

NOT_INHERITED = ("components", "components_concurrently")
"""Top-level ``reward`` keys that describe the combination, not each component."""


@attrs.define(kw_only=True)
class ComponentKeys:
    """The keys of a ``reward.components.<name>`` section beside its manager's reward keys."""

    weight: float = option(
        help="Factor of this component's token-level scores in the run's reward (negative "
        "for a penalty, 0 to log it without training on it)."
    )
    manager: str = option(
        "naive",
        "Reward manager of this component; unset: the top-level reward.manager.",
        registry="reward_managers",
    )


@attrs.frozen
class ComponentSpec:
    """One component as the recipe gives it: its name, weight, manager and that manager's
    config."""

    name: str
    weight: float
    manager: str
    config: RewardConfig


def component_sections(reward: Mapping[str, Any], plugins: PluginManager) -> dict[str, Any]:
    """Each component's whole section, from the raw ``reward`` mapping of a recipe: the
    inherited top-level keys overlaid with its own, its ``manager`` and ``weight`` set, all
    checked with one-line errors keyed ``reward.components.<name>.<key>``. Reading a result
    again (a recorded recipe) gives the same sections."""
    components = reward.get("components") or {}
    if not isinstance(components, Mapping):
        raise RecipeError(
            f"expected a mapping of components by name, got {describe_value(components)}",
            key="reward.components",
        )
    if not components:
        if reward.get("components_concurrently"):
            raise RecipeError(
                "has no effect without reward.components; set components or remove it",
                key="reward.components_concurrently",
            )
        return {}
    inherited = {k: v for k, v in reward.items() if k not in NOT_INHERITED}
    default_manager = str(reward.get("manager", fields_of(RewardConfig)["manager"].default))
    sections: dict[str, Any] = {}
    for name, own in components.items():
        key = _check_name(name)
        if not isinstance(own, Mapping):
            raise RecipeError(
                "expected a section of keys (weight, manager and the manager's reward keys), "
                f"got {describe_value(own)}",
                key=key,
            )
        for nested in NOT_INHERITED:
            if nested in own:
                raise RecipeError(
                    "a component cannot hold components; list every component under "
                    "reward.components",
                    key=f"{key}.{nested}",
                )
        if "weight" not in own:
            raise RecipeError(
                "missing; every component needs a weight (1.0 adds its score as it is)",
                key=f"{key}.weight",
            )
        manager = own.get("manager", default_manager)
        config_cls = _config_class(manager, plugins, f"{key}.manager")
        known = fields_of(config_cls)
        section = {k: v for k, v in inherited.items() if k in known}
        section.update({k: v for k, v in own.items() if k != "weight"})
        section["manager"] = manager
        section = {"weight": own["weight"], **section}
        read_component(name, section, plugins, default_manager)
        sections[str(name)] = section
    return sections


def read_component(
    name: str, section: Mapping[str, Any], plugins: PluginManager, default_manager: str = "naive"
) -> ComponentSpec:
    """One component's section (``weight``, ``manager`` and the manager's reward keys) read
    into its manager's config class, with one-line errors keyed
    ``reward.components.<name>.<key>``."""
    key = _check_name(name)
    own = {k: section[k] for k in ("weight", "manager") if k in section}
    own.setdefault("manager", default_manager)
    if "weight" not in own:
        raise RecipeError(
            "missing; every component needs a weight (1.0 adds its score as it is)",
            key=f"{key}.weight",
        )
    keys = structure(ComponentKeys, own, key)
    config_cls = _config_class(keys.manager, plugins, f"{key}.manager")
    rest = {k: v for k, v in section.items() if k != "weight"}
    rest["manager"] = keys.manager
    config = structure(config_cls, rest, key)
    for nested in NOT_INHERITED:
        if getattr(config, nested):
            raise RecipeError(
                "a component cannot hold components; list every component under reward.components",
                key=f"{key}.{nested}",
            )
    holder = _RecipeOfComponent(config)
    for function in config.function_args:
        try:
            function_options(holder, function, plugins)
        except RecipeError as exc:
            raise component_error(exc, str(name)) from None
    return ComponentSpec(str(name), keys.weight, keys.manager, config)


def read_components(reward: RewardConfig, plugins: PluginManager) -> list[ComponentSpec]:
    """Every component of a ``reward`` section, in recipe order."""
    return [
        read_component(name, section, plugins, reward.manager)
        for name, section in reward.components.items()
    ]


@attrs.frozen
class _RecipeOfComponent:
    """What :func:`~plugrl.parts.scoring.function_options` reads of a recipe: its reward."""

    reward: RewardConfig


def _check_name(name: Any) -> str:
    key = f"reward.components.{name}"
    if not isinstance(name, str) or not COMPONENT_NAME.fullmatch(name):
        raise RecipeError(
            f"{describe_value(name)} cannot name a component: its metrics are "
            "reward/NAME/*; use letters, digits, '_' and '-', starting with a letter",
            key=key,
        )
    if name in RESERVED_NAMES:
        raise RecipeError(
            f"{name!r} cannot name a component: reward/{name} counts the samples of all "
            "components; choose another name",
            key=key,
        )
    return key


def _config_class(manager: Any, plugins: PluginManager, key: str) -> type:
    if not isinstance(manager, str):
        raise RecipeError(f"expected a name, got {describe_value(manager)}", key=key)
    registry = plugins.registry("reward_managers")
    if manager not in registry:
        raise RecipeError(registry.unknown(manager).bare_message, key=key)
    entry = registry.get(manager)
    if entry.unavailable_reason:
        raise RecipeError(
            f"{registry.human_name} {manager!r} (plugin {entry.plugin!r}) is installed but "
            f"cannot run here: it {entry.unavailable_reason}",
            key=key,
        )
    config_cls = entry.load_config() or RewardConfig
    if not (isinstance(config_cls, type) and issubclass(config_cls, RewardConfig)):
        raise RecipeError(
            f"plugin {entry.plugin!r} registered {manager!r} with config {config_cls!r}, "
            "which must subclass plugrl.parts.reward.RewardConfig",
            key=key,
        )
    return config_cls


def component_error(exc: PlugrlError, name: str) -> PlugrlError:
    """``exc``, raised by component ``name`` or about it, as the same kind of one-line error
    naming the component: a recipe key ``reward.X`` becomes ``reward.components.<name>.X``."""
    if isinstance(exc, RecipeError) and exc.key and exc.key.startswith("reward."):
        rekeyed = f"reward.components.{name}.{exc.key.removeprefix('reward.')}"
        return RecipeError(exc.bare_message, key=rekeyed)
    message = f"reward component {name!r}: {exc}"
    try:
        return type(exc)(message)
    except TypeError:  # an error class with a constructor of its own
        return PlugrlError(message)
