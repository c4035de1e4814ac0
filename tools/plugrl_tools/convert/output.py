"""What ``plugrl convert`` prints: the recipe as YAML, whether it validates here, and the
report of every override that was not converted and why."""

from __future__ import annotations

import copy
import logging
import re
import textwrap
from typing import Any

import attrs
import yaml

from plugrl.errors import PlugrlError
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import KNOWN_EXTERNAL, PART_KINDS
from plugrl.recipe.build import build_recipe
from plugrl.recipe.composition import normalize_shorthand
from plugrl_tools.convert.verl import CATEGORIES, PLACEHOLDER_TITLE, Conversion
from plugrl_tools.paths import missing_files

_PLACEHOLDER = re.compile(r"<[A-Za-z_][A-Za-z0-9_]*>")
"""A variable the script does not set, in a path the recipe holds as a placeholder."""


class _Dumper(yaml.SafeDumper):
    """Lists of plain values on one line (``logger: [console, jsonl]``)."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(not isinstance(item, (dict, list)) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def recipe_yaml(conversion: Conversion) -> str:
    """The recipe, with a header that names the script, one blank line between sections."""
    header = (
        f"# Converted by `plugrl convert verl` from {conversion.source} "
        f"({conversion.module}, line {conversion.line}).\n"
        "# Only keys that differ from plugrl's defaults are set (plugrl run RECIPE "
        "--print-config\n# shows them all); the conversion report lists what was not "
        "converted, and why.\n"
    )
    for comment in conversion.comments:
        header += "".join(f"# {line}\n" for line in textwrap.wrap(comment, 90))
    sections = [
        yaml.dump({name: body}, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        for name, body in conversion.recipe.items()
    ]
    return header + "\n" + "\n".join(sections)


@attrs.frozen
class Validation:
    """Whether a converted recipe validates with the plugins installed here."""

    missing: tuple[tuple[str, str, Any], ...] = ()
    """(key, message, plugrl's default) for each part the recipe chooses that is not
    installed here, or is installed but cannot run here (its library is missing)."""
    error: str | None = None
    """The first error of the recipe with those keys at plugrl's defaults; ``None``: it
    validates."""
    warnings: tuple[str, ...] = ()
    """What the recipe checks warn of (a setting that has no effect)."""
    missing_files: tuple[tuple[str, str], ...] = ()
    """The data and reward files the recipe names that are not here (``plugrl run
    --print-config`` refuses them; a script is often converted away from its data)."""


def validate(
    recipe: dict[str, Any], plugins: PluginManager, *, check_files: bool = True
) -> Validation:
    """Build the recipe as ``plugrl run --print-config`` does. Parts that are not installed
    here, or cannot run here, are named, and the rest is validated with plugrl's default parts
    in their place: a recipe for an NPU cluster converted on a laptop still validates.
    ``check_files``: also look for the files it names (:attr:`Validation.missing_files`)."""
    rest = normalize_shorthand(copy.deepcopy(recipe))
    missing: list[tuple[str, str, Any]] = []
    for kind in PART_KINDS.values():
        section = rest.get(kind.section)
        if kind.section_config is None or not isinstance(section, dict):
            continue
        name = section.get(kind.selector)
        registry = plugins.registry(kind.name)
        if not isinstance(name, str) or (kind.accepts_auto and name == "auto"):
            continue
        if name in registry:
            entry = registry.get(name)
            if entry.available:
                continue
            message = (
                f"{kind.human_name} {name!r} (plugin {entry.plugin!r}) is installed but cannot "
                f"run here: it {entry.unavailable_reason}"
            )
            # its own keys (rollout.enable_chunked_prefill of vllm) are not the default part's
            own = entry.load_config()
            base_keys = {field.name for field in attrs.fields(kind.section_base())}
            for key in [field.name for field in attrs.fields(own)] if own else []:
                if key not in base_keys:
                    section.pop(key, None)
        else:
            install = KNOWN_EXTERNAL.get((kind.name, name))
            where = f": {install}" if install else "; no installed plugin registers it"
            message = f"{kind.human_name} {name!r} is not installed{where}"
        default = getattr(kind.section_base()(), kind.selector)
        missing.append((kind.recipe_key, message, default))
        del section[kind.selector]
    checks = logging.getLogger("plugrl.recipe")
    collected = _Collect()
    propagates = checks.propagate
    checks.addHandler(collected)
    checks.propagate = False
    try:
        built = build_recipe(rest, plugins)
    except PlugrlError as exc:
        return Validation(tuple(missing), str(exc), tuple(collected.messages))
    finally:
        checks.removeHandler(collected)
        checks.propagate = propagates
    files = tuple(missing_files(built)) if check_files else ()
    return Validation(tuple(missing), None, tuple(collected.messages), files)


class _Collect(logging.Handler):
    """Keeps the warnings of the recipe checks for the report, instead of printing them
    before it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def report(conversion: Conversion, validation: Validation, recipe_name: str) -> list[str]:
    """The lines of the report: what was not converted, by reason; notes; validation."""
    unmapped = conversion.unmapped
    lines = [
        f"{conversion.source}, line {conversion.line} ({conversion.module}): "
        f"{conversion.overrides} overrides, {conversion.overrides - len(unmapped)} converted, "
        f"{len(unmapped)} not"
    ]
    for category, title in CATEGORIES.items():
        items = sorted((u for u in unmapped if u.category == category), key=lambda u: u.line)
        if items and category == "unsupported":
            # one line per feature: the settings of a feature plugrl lacks share their reason
            lines.append(f"{title} ({len(items)}):")
            for reason in dict.fromkeys(u.reason for u in items):
                named = [f"{u.override} (line {u.line})" for u in items if u.reason == reason]
                lines.append(f"  {reason}: {'; '.join(named)}")
        elif items:
            lines.append(f"{title} ({len(items)}):")
            lines += [f"  line {u.line}: {u.override}: {u.reason}" for u in items]
    if conversion.placeholders:
        lines.append(f"{PLACEHOLDER_TITLE} ({len(conversion.placeholders)}):")
        lines += [f"  line {u.line}: {u.override}: {u.reason}" for u in conversion.placeholders]
    if any("is not set in the script" in u.reason for u in [*unmapped, *conversion.placeholders]):
        lines.append("  (give variables the script does not set with --env NAME=VALUE)")
    if conversion.notes:
        lines.append("notes:")
        lines += [f"  {note}" for note in conversion.notes]
    if validation.warnings:
        lines.append("warnings of plugrl's recipe checks:")
        lines += [f"  {warning}" for warning in validation.warnings]
    # a placeholder's file is missing by design: its own line above says to fill it in
    missing_files = [
        (key, path) for key, path in validation.missing_files if not _PLACEHOLDER.search(path)
    ]
    if missing_files:
        named = "; ".join(f"{key}: {path}" for key, path in missing_files)
        lines.append(
            f"files not found here: {named} (plugrl run --print-config checks them where it runs)"
        )
    for key, message, _ in validation.missing:
        lines.append(f"not usable here: {key}: {message}")
    if validation.error is None:
        with_defaults = " ".join(f"{key}={default}" for key, _, default in validation.missing)
        if validation.missing:
            lines.append(
                f"the rest validates: plugrl run {recipe_name} {with_defaults} --print-config"
            )
        else:
            lines.append(f"the recipe validates: plugrl run {recipe_name} --print-config")
    return lines
