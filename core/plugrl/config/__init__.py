"""Helpers for attrs config classes: every recipe key carries its help text and verl name.

Config classes are ``@attrs.define(kw_only=True)`` classes whose fields are made with
:func:`option`; ``plugrl explain KEY`` reads the metadata it stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

_NOTHING: Any = attrs.NOTHING

PATH_KINDS = ("model", "input", "output")
"""What a path option names: ``model``, a Hugging Face model folder (holds ``config.json``);
``input``, a file or folder the run reads; ``output``, a folder the run writes."""


def option(
    default: Any = _NOTHING,
    help: str = "",
    *,
    verl: str | None = None,
    choices: Sequence[Any] | None = None,
    registry: str | None = None,
    factory: Callable[[], Any] | None = None,
    validator: Any = None,
    path: str | None = None,
    path_words: Sequence[str] = (),
) -> Any:
    """An attrs field with documentation.

    * ``help``: what the key means, in one or two sentences; shown by ``plugrl explain``.
    * ``verl``: the verl key with the same meaning (``actor_rollout_ref.actor.optim.lr``).
    * ``choices``: the allowed values; checked when the recipe is read.
    * ``registry``: the plugin kind whose registered names are the allowed values
      (``"advantage_estimators"``); checked against the installed plugins.
    * ``path``: the value is a local path (a string, or a list of them), one of
      :data:`PATH_KINDS`. A relative path is made absolute against the working folder of the
      process that reads the recipe (:func:`plugrl.recipe.resolve_paths`), so that workers on
      other machines, which start in folders of their own, reach the same file; on a Ray
      cluster every node is checked to see it (:mod:`plugrl.cluster.nodes`).
    * ``path_words``: values of a path option that are words, not paths (``auto`` of
      ``trainer.resume_mode``).
    """
    if path is not None and path not in PATH_KINDS:
        raise ValueError(f"path must be one of {', '.join(PATH_KINDS)}, not {path!r}")
    metadata = {
        "help": help,
        "verl": verl,
        "choices": choices,
        "registry": registry,
        "path": path,
        "path_words": tuple(path_words),
    }
    validators = []
    if choices is not None:
        validators.append(one_of(list(choices)))
    if validator is not None:
        validators.append(validator)
    kwargs: dict[str, Any] = {"metadata": metadata}
    if validators:
        kwargs["validator"] = validators
    if factory is not None:
        return attrs.field(factory=factory, **kwargs)
    return attrs.field(default=default, **kwargs)


def section(cls: type, help: str = "", *, verl: str | None = None) -> Any:
    """A nested config section (an attrs class) with its own defaults."""
    return option(help=help, verl=verl, factory=cls)


@attrs.frozen
class PackageNeed:
    """An optional package that a recipe's settings need: ``model.lora_rank`` > 0 on the fsdp2
    backend needs peft. A section's config class lists them in ``packages_needed(recipe)``, and
    the recipe is refused when it is read if one is not installed, before anything loads."""

    key: str
    """The recipe key whose value asks for the package."""
    module: str
    """Its import name (``peft``), looked up without importing it."""
    install: str
    """The command that installs it, with the setting that avoids it if there is one."""


class ConfigValueError(ValueError):
    """Raised by config validators; names the attribute so the recipe error names the key."""

    def __init__(self, attribute: str, message: str) -> None:
        super().__init__(message, attribute)
        self.attribute = attribute
        self.message = message

    def __str__(self) -> str:
        return f"{self.attribute}: {self.message}"


def one_of(choices: list[Any]) -> Callable[[Any, attrs.Attribute, Any], None]:
    """Validator: the value is one of ``choices``."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            listed = ", ".join("null" if c is None else str(c) for c in choices)
            raise ConfigValueError(attribute.name, f"must be one of {listed}, got {value!r}")

    return check


def positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Validator: the value is > 0 (``None`` allowed, meaning unset)."""
    if value is not None and value <= 0:
        raise ConfigValueError(attribute.name, f"must be > 0, got {value!r}")


def non_negative(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Validator: the value is >= 0 (``None`` allowed, meaning unset)."""
    if value is not None and value < 0:
        raise ConfigValueError(attribute.name, f"must be >= 0, got {value!r}")


def fraction(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Validator: the value lies in [0, 1]."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigValueError(attribute.name, f"must be between 0 and 1, got {value!r}")
