"""verl's name of every recipe key that declares one (``option(..., verl="...")``): the core's
sections, the config classes of the installed plugins' parts (an engine's own ``rollout`` keys,
a reward manager's ``reward`` keys, ...) and the option classes of estimators and losses
(``actor.policy_loss_args``).

Each name says which part declares it, so that a key of one engine is not taken for a key of
another; ``plugrl convert verl`` reads a verl script's overrides with this index.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import attrs

from plugrl.config.structuring import fields_of
from plugrl.errors import PluginError
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import PART_KINDS
from plugrl.recipe.sections import Recipe


@attrs.frozen
class VerlName:
    """A recipe key and the verl key of the same meaning."""

    verl: str
    """verl's dotted key (``actor_rollout_ref.actor.optim.lr``)."""
    key: str
    """plugrl's dotted key (``actor.optim.lr``)."""
    field: attrs.Attribute
    """The option (its type resolved): type, default, choices, validators."""
    kind: str | None = None
    """The kind of part whose config class declares the key (``"rollout_engines"``); ``None``
    for the core's keys."""
    part: str | None = None
    """The registered name of that part (``"vllm"``)."""
    default: Any = None
    """The key's value when a recipe does not set it."""
    plugin: str | None = None
    """The plugin that registered that part."""


def verl_names(plugins: PluginManager) -> dict[str, list[VerlName]]:
    """verl key -> the recipe keys that declare it: the core's first, then those of the
    installed plugins' parts (a key several parts declare, such as an engine setting, has one
    entry per part)."""
    index: dict[str, list[VerlName]] = {}
    for name in _leaves(Recipe(), ""):
        index.setdefault(name.verl, []).append(name)
    for kind in PART_KINDS.values():
        if kind.section_config is None and kind.args_key is None:
            continue
        base = kind.section_base() if kind.section_config is not None else None
        prefix = f"{kind.section}." if base is not None else f"{kind.args_key}."
        for entry in plugins.registry(kind.name):
            try:
                cls = entry.load_config()
            except PluginError:
                continue
            if not (isinstance(cls, type) and attrs.has(cls)) or cls is base:
                continue
            try:
                defaults = cls()
            except Exception:  # a class with required options has no defaults to compare with
                continue
            inherited = set(fields_of(base)) if base is not None else set()
            for name in _leaves(defaults, prefix, skip=inherited):
                owned = attrs.evolve(name, kind=kind.name, part=entry.name, plugin=entry.plugin)
                index.setdefault(name.verl, []).append(owned)
    return index


def _leaves(
    config: Any, prefix: str, skip: Collection[str] = (), verl_prefix: str | None = None
) -> Iterator[VerlName]:
    """Every option of a default ``config`` object (nested sections walked) that declares a
    verl name.

    A section class used in two places (``actor.optim`` and ``critic.optim``) declares the
    verl names of one of them; under a section whose own verl name differs
    (``critic.optim``), its options take that name as their prefix.
    """
    for name, field in fields_of(type(config)).items():
        if name in skip:
            continue
        verl = field.metadata.get("verl")
        if verl_prefix and verl and not verl.startswith(verl_prefix + "."):
            verl = f"{verl_prefix}.{name}"
        value = getattr(config, name)
        if attrs.has(type(value)):
            yield from _leaves(value, f"{prefix}{name}.", verl_prefix=verl)
        elif verl:
            yield VerlName(verl, prefix + name, field, default=value)
