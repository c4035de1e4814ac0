"""Building one part: load the class a plugin registered, check that it fits its interface,
and construct it as ``cls(config, context)``."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from plugrl.errors import PluginError
from plugrl.parts.context import PartContext
from plugrl.plugins import get_plugin_manager
from plugrl.recipe import part_args

if TYPE_CHECKING:
    from plugrl.parts.algorithm import AdvantageEstimator, PolicyLoss
    from plugrl.plugins import PluginManager
    from plugrl.recipe import Recipe
    from plugrl.registry import Entry


def check_constructor(entry: Entry, cls: Any) -> None:
    """Raise a one-line :class:`PluginError` when ``cls`` cannot be called as
    ``cls(config, context)``."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return  # a builtin or C class: let the call itself decide
    try:
        signature.bind(object(), object())
    except TypeError:
        name = getattr(cls, "__qualname__", repr(cls))
        raise PluginError(
            f"{entry.human_name} {entry.name!r} from plugin {entry.plugin!r}: "
            f"{name}{signature} does not fit the interface; plugrl builds every part as "
            f"{name}(config, context) (see docs/plugins.md)"
        ) from None


def build_part(kind: str, name: str, config: Any, context: Any) -> Any:
    """The part registered as ``name`` of ``kind``, built as ``cls(config, context)`` with the
    registry of ``context.plugins`` (the process's plugin manager when unset). ``context`` is
    a :class:`PartContext`, or the :class:`~plugrl.run.RunContext` for a scheduler."""
    plugins = context.plugins or get_plugin_manager()
    entry = plugins.registry(kind).get(name)
    cls = entry.load()
    check_constructor(entry, cls)
    return cls(config, context)


def build_estimator(recipe: Recipe, plugins: PluginManager | None = None) -> AdvantageEstimator:
    """The estimator ``algorithm.adv_estimator`` names, with its
    ``algorithm.adv_estimator_args``."""
    plugins = plugins or get_plugin_manager()
    options = part_args(recipe, "algorithm", "adv_estimator_args", plugins)
    context = PartContext(recipe=recipe, plugins=plugins, options=options)
    return build_part(
        "advantage_estimators", recipe.algorithm.adv_estimator, recipe.algorithm, context
    )


def build_policy_loss(recipe: Recipe, plugins: PluginManager | None = None) -> PolicyLoss:
    """The loss ``actor.policy_loss`` names, with its ``actor.policy_loss_args``."""
    plugins = plugins or get_plugin_manager()
    options = part_args(recipe, "actor", "policy_loss_args", plugins)
    context = PartContext(recipe=recipe, plugins=plugins, options=options)
    return build_part("policy_losses", recipe.actor.policy_loss, recipe.actor, context)
