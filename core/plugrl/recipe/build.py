"""Building a :class:`Recipe` from a composed mapping: each section read into its class (the
chosen plugin's, for sections a part owns), every name of a part checked against the installed
plugins, the options of chosen parts checked, and then the recipe as a whole
(:func:`~plugrl.recipe.checks.check_recipe`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugrl.config.structuring import describe_value, fields_of, structure, unknown_key_error
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.scoring import function_options
from plugrl.plugin.build import dotted_get
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import PART_KINDS, PartKind, section_kind
from plugrl.recipe.checks import check_recipe
from plugrl.recipe.composition import (
    apply_overrides,
    compose_file,
    find_recipe,
    normalize_shorthand,
)
from plugrl.recipe.paths import resolve_paths
from plugrl.recipe.reward_components import component_sections
from plugrl.recipe.sections import Recipe, verl_index


def section_class(name: str, raw: Mapping[str, Any], plugins: PluginManager) -> type:
    """The config class for a recipe section: the chosen plugin's for plugin sections."""
    kind = section_kind(name)
    if kind is None:
        return fields_of(Recipe)[name].type
    base = kind.section_base()
    chosen = raw.get(kind.selector, fields_of(base)[kind.selector].default)
    if not isinstance(chosen, str):
        raise RecipeError(f"expected a name, got {describe_value(chosen)}", key=kind.recipe_key)
    if kind.accepts_auto and chosen == "auto":
        return base
    entry = plugins.registry(kind.name).get(chosen)
    config_cls = entry.load_config() or base
    if not (isinstance(config_cls, type) and issubclass(config_cls, base)):
        raise PluginError(
            f"plugin {entry.plugin!r} registered {chosen!r} with config "
            f"{config_cls!r}, which must subclass {base.__module__}.{base.__name__}"
        )
    return config_cls


def build_recipe(
    raw: Mapping[str, Any], plugins: PluginManager, *, runnable_here: bool = True
) -> Recipe:
    """Validate a composed recipe mapping into a :class:`Recipe`, resolving plugin sections,
    then check that its settings fit together (:func:`check_recipe`). Relative paths come back
    absolute, against the working folder (:func:`~plugrl.recipe.paths.resolve_paths`).
    ``runnable_here=False`` reads a recipe for another machine (``plugrl plan``): the chosen
    parts must be registered, but their libraries need not be installed here."""
    raw = normalize_shorthand(raw)
    recipe_fields = fields_of(Recipe)
    for name, value in raw.items():
        if name not in recipe_fields:
            raise unknown_key_error(Recipe, str(name), "", value, verl_index())
    values: dict[str, Any] = {}
    for name in recipe_fields:
        section_raw = raw.get(name) or {}
        if not isinstance(section_raw, Mapping):
            raise RecipeError(
                f"expected a section of keys, got {describe_value(section_raw)}", key=name
            )
        cls = section_class(name, section_raw, plugins)
        values[name] = structure(cls, dict(section_raw), name, verl_index())
    recipe = Recipe(**values)
    # each component's whole section, so a recorded recipe reads back the same components
    recipe.reward.components = component_sections(raw.get("reward") or {}, plugins)
    validate_names(recipe, plugins, runnable_here=runnable_here)
    check_recipe(recipe, runnable_here=runnable_here)
    return resolve_paths(recipe, plugins)


def load_recipe(
    path: str | Path | None,
    overrides: Sequence[str],
    plugins: PluginManager,
    *,
    runnable_here: bool = True,
) -> Recipe:
    """Read a recipe file (or none: all defaults), apply overrides, validate with the
    parts ``plugins`` registers (see :func:`build_recipe` for ``runnable_here``)."""
    raw = compose_file(find_recipe(path)) if path is not None else {}
    return build_recipe(apply_overrides(raw, overrides), plugins, runnable_here=runnable_here)


def iter_options(obj: Any, prefix: str = "") -> Iterator[tuple[str, attrs.Attribute, Any]]:
    """Every leaf option of a config object: (dotted key, attribute, value)."""
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        key = f"{prefix}{field.name}"
        if attrs.has(type(value)):
            yield from iter_options(value, key + ".")
        else:
            yield key, field, value


def read_section(name: str, raw: Mapping[str, Any], plugins: PluginManager, key: str) -> Any:
    """``raw`` read as the recipe section ``name`` the way :func:`build_recipe` reads it (into
    the chosen plugin's config class, every part it names checked), for a section that sits
    elsewhere in a recipe: a judge model's own ``rollout`` at ``reward.judge.rollout``, say.
    Errors are keyed under ``key`` (``reward.judge.rollout.engine: unknown ...``)."""
    try:
        cls = section_class(name, raw, plugins)
    except RecipeError as exc:
        rest = (exc.key or "").partition(".")[2]
        raise type(exc)(exc.bare_message, key=f"{key}.{rest}" if rest else key) from None
    section = structure(cls, dict(raw), key, verl_index())
    check_part_names(section, plugins, f"{key}.")
    return section


def check_part_names(
    config: Any, plugins: PluginManager, prefix: str = "", *, runnable_here: bool = True
) -> None:
    """Check every option of ``config`` (a recipe or a section of one, keys under ``prefix``)
    that names a registered part: it is registered and (``runnable_here``) can run here."""
    for key, field, value in iter_options(config, prefix):
        kind_name = field.metadata.get("registry")
        if not kind_name or (PART_KINDS[kind_name].accepts_auto and value == "auto"):
            continue
        if value is None:  # an optional part left unset (rollout.agent.env)
            continue
        kind = PART_KINDS[kind_name]
        if not kind.needed_at_default and value == field.default:
            continue
        registry = plugins.registry(kind_name)
        for name in value if isinstance(value, list) else [value]:
            if name not in registry:
                raise RecipeError(registry.unknown(name).bare_message, key=key)
            reason = registry.get(name).unavailable_reason if runnable_here else None
            if reason:
                raise RecipeError(
                    f"{registry.human_name} {name!r} (plugin {registry.get(name).plugin!r}) is "
                    f"installed but cannot run here: it {reason}",
                    key=key,
                )


def validate_names(recipe: Recipe, plugins: PluginManager, *, runnable_here: bool = True) -> None:
    """Check every option that names a registered part, and the args of chosen parts."""
    check_part_names(recipe, plugins, runnable_here=runnable_here)
    for kind in PART_KINDS.values():
        if kind.args_key is None:
            continue
        owner = getattr(recipe, kind.section)
        chosen = dotted_get(owner, kind.selector)
        if chosen is None:  # an optional part left unset
            continue
        if not kind.needed_at_default and chosen not in plugins.registry(kind.name):
            continue  # at its default (check_part_names let it through), so unused
        entry = plugins.registry(kind.name).get(chosen)
        args = dotted_get(owner, _args_field(kind))
        config_cls = entry.load_config()
        if config_cls is None:
            if args:
                raise RecipeError(
                    f"{entry.name!r} takes no options, got {', '.join(map(str, args))}",
                    key=kind.args_key,
                )
            continue
        structure(config_cls, dict(args), kind.args_key)
    for name in recipe.reward.function_args:
        function_options(recipe, name, plugins)
    check_tool_args(recipe, plugins)


def tool_args(recipe: Recipe, name: str, plugins: PluginManager) -> Any:
    """Tool ``name``'s options (``rollout.agent.tool_args.<name>``) read into its config class,
    ``None`` when it registered none (then it takes no options)."""
    key = f"rollout.agent.tool_args.{name}"
    raw = dict(recipe.rollout.agent.tool_args.get(name) or {})
    config_cls = plugins.registry("tools").get(name).load_config()
    if config_cls is None:
        if raw:
            raise RecipeError(f"tool {name!r} takes no options, got {', '.join(raw)}", key=key)
        return None
    return structure(config_cls, raw, key)


def check_tool_args(recipe: Recipe, plugins: PluginManager) -> None:
    """Refuse options of a tool the run does not use; check each used tool's options."""
    agent = recipe.rollout.agent
    for name in agent.tool_args:
        if name not in agent.tools:
            raise RecipeError(
                f"options for tool {name!r}, which rollout.agent.tools does not list "
                f"({', '.join(agent.tools) or 'empty'}); add it there or drop its options",
                key=f"rollout.agent.tool_args.{name}",
            )
    for name in agent.tools:
        tool_args(recipe, name, plugins)


def _args_field(kind: PartKind) -> str:
    """The field of :attr:`PartKind.args_key` within its section."""
    assert kind.args_key is not None
    return kind.args_key.partition(".")[2]
