"""``plugrl explain``: the meaning, type, default, allowed values and verl name of a recipe key
(or the keys of a section), from the metadata of the config classes, the plugins' included."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.config.structuring import fields_of, unknown_key_error
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.reward import RewardConfig
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import PART_KINDS, section_kind
from plugrl.recipe.reward_components import NOT_INHERITED, ComponentKeys
from plugrl.recipe.sections import Recipe, verl_index


@attrs.frozen
class KeyInfo:
    """What ``plugrl explain`` prints about one key or section."""

    key: str
    help: str
    type: str
    default: Any
    verl: str | None
    choices: list[Any] | None
    owner: str  # "core" or "plugin NAME"
    is_section: bool = False
    children: tuple[str, ...] = ()


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default_of(field: attrs.Attribute) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def _config_classes(section_name: str, plugins: PluginManager) -> list[tuple[type, str]]:
    """The base class of a section, then each registered plugin config class extending it."""
    kind = section_kind(section_name)
    if kind is None:
        return [(fields_of(Recipe)[section_name].type, "core")]
    base = kind.section_base()
    classes: list[tuple[type, str]] = [(base, "core")]
    for entry in plugins.registry(kind.name):
        try:
            cls = entry.load_config()
        except PluginError:
            continue
        extends_base = isinstance(cls, type) and issubclass(cls, base)
        if extends_base and cls is not base and all(cls is not c for c, _ in classes):
            classes.append((cls, f"{entry.name} ({entry.plugin})"))
    return classes


def explain(key: str, plugins: PluginManager) -> KeyInfo:
    """Describe a dotted recipe key (or a section): meaning, type, default, verl name."""
    parts = key.split(".")
    options = _explain_part_options(parts, plugins)
    if options is not None:
        return options
    if parts[:2] == ["reward", "components"] and len(parts) == 3:
        return _explain_component(key, plugins)
    recipe_fields = fields_of(Recipe)
    if parts[0] not in recipe_fields:
        raise unknown_key_error(Recipe, parts[0], "", verl_names=verl_index())
    if len(parts) == 1:
        children: list[str] = []
        for cls, _owner in _config_classes(parts[0], plugins):
            children += [n for n in fields_of(cls) if n not in children]
        field = recipe_fields[parts[0]]
        return KeyInfo(
            key,
            field.metadata.get("help", ""),
            "section",
            None,
            None,
            None,
            "core",
            True,
            tuple(children),
        )
    last_error: RecipeError | None = None
    for cls, owner in _config_classes(parts[0], plugins):
        try:
            return _explain_in(cls, parts, owner, plugins)
        except RecipeError as exc:
            last_error = last_error or exc
    assert last_error is not None
    raise last_error


def _explain_component(key: str, plugins: PluginManager) -> KeyInfo:
    """``reward.components.NAME``: a section of its own keys and every manager's."""
    children = list(fields_of(ComponentKeys))
    for cls, _owner in _config_classes("reward", plugins):
        children += [n for n in fields_of(cls) if n not in children and n not in NOT_INHERITED]
    return KeyInfo(
        key,
        "A weighted reward component: a reward manager read from the top-level reward keys "
        "it has, overlaid with these.",
        "section",
        None,
        None,
        None,
        "core",
        True,
        tuple(children),
    )


def _option_owners(parts: list[str], plugins: PluginManager) -> list[tuple[str, type, str]]:
    """For a key inside a part's options mapping: ``(prefix, config class, owner)`` of every
    registered part whose options class could hold it. ``actor.policy_loss_args.X`` looks in
    every policy loss's class, ``reward.function_args.NAME.X`` in the class of function NAME."""
    dotted = ".".join(parts)
    if parts[:2] == ["reward", "components"] and len(parts) > 3:
        # a component's keys: its own (weight, manager), or those of a manager's section
        prefix = ".".join(parts[:3])
        for shared in (ComponentKeys, RewardConfig):
            if parts[3] in fields_of(shared):
                return [(prefix, shared, "core")]
        return [
            (prefix, cls, f"reward manager {owner}")
            for cls, owner in _config_classes("reward", plugins)[1:]
        ]
    if parts[:2] == ["reward", "function_args"] and len(parts) > 3:
        registry = plugins.registry("reward_functions")
        name = parts[2]
        if name not in registry:
            raise RecipeError(registry.unknown(name).bare_message, key=".".join(parts[:3]))
        entry = registry.get(name)
        cls = entry.load_config()
        if cls is None:
            raise RecipeError(
                f"reward function {name!r} (plugin {entry.plugin!r}) takes no options",
                key=".".join(parts[:3]),
            )
        return [(".".join(parts[:3]), cls, f"reward function {name} ({entry.plugin})")]
    if parts[:3] == ["trainer", "health", "check_args"] and len(parts) > 4:
        registry = plugins.registry("health_checks")
        name = parts[3]
        if name not in registry:
            raise RecipeError(registry.unknown(name).bare_message, key=".".join(parts[:4]))
        entry = registry.get(name)
        from plugrl.parts.health import HealthCheckConfig

        cls = entry.load_config() or HealthCheckConfig
        return [(".".join(parts[:4]), cls, f"health check {name} ({entry.plugin})")]
    for kind in PART_KINDS.values():
        if kind.args_key and dotted.startswith(kind.args_key + ".") and len(parts) > 2:
            owners = []
            for entry in plugins.registry(kind.name):
                try:
                    cls = entry.load_config()
                except PluginError:
                    continue
                if cls is not None:
                    owners.append(
                        (kind.args_key, cls, f"{kind.human_name} {entry.name} ({entry.plugin})")
                    )
            return owners
    return []


def _explain_part_options(parts: list[str], plugins: PluginManager) -> KeyInfo | None:
    owners = _option_owners(parts, plugins)
    if not owners:
        return None
    prefix = owners[0][0]
    rest = parts[len(prefix.split(".")) :]
    found: list[KeyInfo] = []
    first_error: RecipeError | None = None
    for _, cls, owner in owners:
        try:
            found.append(_explain_in(cls, [prefix, *rest], owner, plugins))
        except RecipeError as exc:
            first_error = first_error or exc
    if not found:
        assert first_error is not None
        if len(owners) == 1:
            raise first_error
        listed = "; ".join(f"{owner}: {', '.join(fields_of(cls))}" for _, cls, owner in owners)
        raise RecipeError(f"no part's options have it ({listed})", key=".".join(parts))
    if len(found) == 1:
        return found[0]
    # the same option name in several parts' classes: say whose
    return attrs.evolve(found[0], owner=", ".join(info.owner for info in found))


def _explain_in(cls: type, parts: list[str], owner: str, plugins: PluginManager) -> KeyInfo:
    current = cls
    for depth, name in enumerate(parts[1:], start=1):
        fields = fields_of(current)
        if name not in fields:
            raise unknown_key_error(current, name, ".".join(parts[:depth]), verl_names=verl_index())
        field = fields[name]
        ftype = field.type
        if depth == len(parts) - 1:
            key = ".".join(parts)
            if isinstance(ftype, type) and attrs.has(ftype):
                return KeyInfo(
                    key,
                    field.metadata.get("help", ""),
                    "section",
                    None,
                    field.metadata.get("verl"),
                    None,
                    owner,
                    True,
                    tuple(fields_of(ftype)),
                )
            choices = field.metadata.get("choices")
            kind = field.metadata.get("registry")
            if kind:
                choices = plugins.registry(kind).names()
            return KeyInfo(
                key,
                field.metadata.get("help", ""),
                _type_name(ftype),
                _default_of(field),
                field.metadata.get("verl"),
                list(choices) if choices is not None else None,
                owner,
            )
        if not (isinstance(ftype, type) and attrs.has(ftype)):
            raise RecipeError(
                f"{field.name!r} is an option, not a section", key=".".join(parts[: depth + 1])
            )
        current = ftype
    raise RecipeError("not found", key=".".join(parts))
