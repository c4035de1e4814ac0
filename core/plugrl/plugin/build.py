"""Building one part: load the class a plugin registered, check that it fits its interface,
and construct it as ``cls(config, context)``."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from plugrl.config.structuring import structure
from plugrl.errors import PluginError
from plugrl.parts.context import PartContext
from plugrl.plugin.registry import PART_KINDS, import_object

if TYPE_CHECKING:
    from plugrl.parts.algorithm import AdvantageEstimator, PolicyLoss
    from plugrl.parts.device import Device
    from plugrl.plugin.manager import PluginManager
    from plugrl.plugin.registry import Entry
    from plugrl.recipe import Recipe


def check_constructor(entry: Entry, cls: Any) -> None:
    """Raise a one-line :class:`PluginError` when ``cls`` does not fit the interface of its
    kind: not a subclass of it, not callable as ``cls(config, context)``, a method it
    overrides that the core could not call as it calls the interface's (a parameter renamed,
    missing or made keyword-only, a default dropped, a new required parameter, or ``def``
    where the interface has ``async def``), or, for an engine, a declared capability whose
    methods it does not implement (:data:`plugrl.parts.rollout.CAPABILITY_METHODS`)."""
    who = f"{entry.human_name} {entry.name!r} from plugin {entry.plugin!r}"
    name = getattr(cls, "__qualname__", repr(cls))
    interface_path = PART_KINDS[entry.kind].interface
    interface = import_object(interface_path) if interface_path else None
    if interface is not None and not (isinstance(cls, type) and issubclass(cls, interface)):
        raise PluginError(
            f"{who}: {name} is not a subclass of {interface.__module__}.{interface.__name__}; "
            "derive it from the interface (see docs/plugins.md)"
        )
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return  # a builtin or C class: let the call itself decide
    try:
        signature.bind(object(), object())
    except TypeError:
        raise PluginError(
            f"{who}: {name}{signature} does not fit the interface; plugrl builds every part as "
            f"{name}(config, context) (see docs/plugins.md)"
        ) from None
    if interface is not None:
        for method, expected in _interface_methods(interface):
            _check_method(who, cls, interface, method, expected)
    if entry.kind == "rollout_engines":
        _check_declared_capabilities(who, cls, interface)


def _interface_methods(interface: type) -> list[tuple[str, Any]]:
    """The methods an interface declares (its own and its bases'): the public ones and
    ``__call__``."""
    methods = {}
    for klass in reversed(interface.__mro__[:-1]):
        for method, value in vars(klass).items():
            public = not method.startswith("_") or method == "__call__"
            if public and inspect.isfunction(value):
                methods[method] = value
    return sorted(methods.items())


def _check_method(who: str, cls: type, interface: type, method: str, expected: Any) -> None:
    actual = inspect.getattr_static(cls, method, None)
    if actual is expected or not inspect.isfunction(actual):
        return
    want = inspect.signature(expected)
    have = inspect.signature(actual)
    if inspect.iscoroutinefunction(expected) != inspect.iscoroutinefunction(actual):
        fixes = (
            ["make it async def (the core awaits it)"]
            if inspect.iscoroutinefunction(expected)
            else ["make it a plain def (the core calls it without awaiting)"]
        )
    else:
        fixes = signature_fixes(want, have)
    if fixes:
        raise PluginError(
            f"{who}: {cls.__qualname__}.{method}{have} does not fit the interface, which has "
            f"{interface.__name__}.{method}{want}; {'; '.join(fixes)} (see docs/plugins.md)"
        )


_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_NAMED = (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)
_VARIADIC = (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)


def signature_fixes(want: inspect.Signature, have: inspect.Signature) -> list[str]:
    """What to change so that a method of signature ``have`` takes every call the core may
    make to the interface's method of signature ``want`` (both with ``self`` first, which
    the core passes by position): each parameter by position where the interface takes it by
    position, by name where it takes it by name, optional ones left out; a new parameter must
    be optional. Each fix says why. Empty when the method fits."""
    wanted = list(want.parameters.values())
    params = list(have.parameters.values())
    named = {p.name: p for p in params if p.kind not in _VARIADIC}
    positional = [p for p in params if p.kind in _POSITIONAL]
    any_name = any(p.kind is _P.VAR_KEYWORD for p in params)
    any_position = any(p.kind is _P.VAR_POSITIONAL for p in params)
    renamed: set[str] = set()
    fixes: list[str] = []
    for index, parameter in enumerate(wanted[1:], start=1):
        if parameter.kind in _VARIADIC:
            continue
        theirs = named.get(parameter.name)
        at = positional[index] if index < len(positional) else None
        if theirs is None:
            if (
                parameter.kind is _P.POSITIONAL_OR_KEYWORD
                and at is not None
                and at.name not in want.parameters
            ):
                renamed.add(at.name)
                fixes.append(
                    f"rename {at.name!r} to {parameter.name!r} (the core may pass it by name)"
                )
            elif parameter.kind is _P.POSITIONAL_ONLY and (at is not None or any_position):
                continue  # passed by position only: any name does
            elif not (any_name and (parameter.kind is _P.KEYWORD_ONLY or any_position)):
                fixes.append(f"add the parameter {parameter.name!r} (the core may pass it)")
            continue
        if parameter.kind in _NAMED and theirs.kind is _P.POSITIONAL_ONLY:
            fixes.append(
                f"let {parameter.name!r} be passed by name, drop the '/' (the core may pass it "
                "by name)"
            )
        elif parameter.kind in _POSITIONAL and theirs.kind is _P.KEYWORD_ONLY:
            fixes.append(
                f"move {parameter.name!r} before the '*' (the core may pass it by position)"
            )
        elif parameter.kind in _POSITIONAL and at is not theirs:
            fixes.append(
                f"put {parameter.name!r} in position {index}, as the interface has it (the core "
                "may pass it by position)"
            )
        if parameter.default is not _P.empty and theirs.default is _P.empty:
            fixes.append(
                f"give {parameter.name!r} the default {parameter.default!r} (the core may call "
                f"it without {parameter.name!r})"
            )
    for parameter in params[1:]:
        if (
            parameter.kind not in _VARIADIC
            and parameter.default is _P.empty
            and parameter.name not in want.parameters
            and parameter.name not in renamed
        ):
            fixes.append(
                f"give {parameter.name!r} a default or remove it (the core never passes it)"
            )
    if not fixes and not all(_binds(have, call) for call in _core_calls(wanted)):
        fixes.append("take the parameters the interface's method takes (new ones optional)")
    return fixes


def _core_calls(wanted: list[inspect.Parameter]) -> list[tuple[list[Any], dict[str, Any]]]:
    """The calls the core may make to a method with parameters ``wanted`` (``self`` first):
    required ones by position and optional ones by name; everything it can by name; the
    required ones alone; everything it can by position."""
    self_, rest = object(), [p for p in wanted[1:] if p.kind not in _VARIADIC]
    required = [p for p in rest if p.default is _P.empty]

    def call(by_position: list[inspect.Parameter], by_name: list[inspect.Parameter]) -> Any:
        return [self_, *(object() for _ in by_position)], {p.name: object() for p in by_name}

    def leading(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
        # only an unbroken run of positional parameters can be passed by position
        run = []
        for parameter in parameters:
            if parameter.kind not in _POSITIONAL:
                break
            run.append(parameter)
        return run

    required_first = leading(required)
    only_by_position = [p for p in rest if p.kind is _P.POSITIONAL_ONLY]
    return [
        call(required_first, [p for p in rest if p not in required_first]),
        call(only_by_position, [p for p in rest if p not in only_by_position]),
        call(leading(required), [p for p in required if p not in leading(required)]),
        call(leading(rest), [p for p in rest if p not in leading(rest)]),
    ]


def _binds(signature: inspect.Signature, call: tuple[list[Any], dict[str, Any]]) -> bool:
    try:
        signature.bind(*call[0], **call[1])
    except TypeError:
        return False
    return True


def _check_declared_capabilities(who: str, cls: type, interface: Any) -> None:
    from plugrl.parts.rollout import unimplemented_capabilities

    missing = unimplemented_capabilities(cls)
    if not missing:
        return
    capability, methods = missing[0]
    described = ", ".join(
        f"{interface.__name__}.{method}{inspect.signature(getattr(interface, method))}"
        for method in methods
    )
    them = "it" if len(methods) == 1 else "them"
    raise PluginError(
        f"{who}: {cls.__qualname__} declares Capability.{capability.name} in capabilities but "
        f"does not override {described}, which that capability needs; implement {them} or "
        f"remove Capability.{capability.name} from capabilities (see docs/plugins.md)"
    )


def check_torch_device_type(entry: Entry, device: Device) -> None:
    """Raise a one-line :class:`PluginError` when torch cannot make a device of the built
    ``device``'s :attr:`~plugrl.parts.device.Device.torch_device_type` (checked once the device
    is built: a torch extension such as torch_npu adds its type when the device imports it)."""
    import torch

    device_type = getattr(device, "torch_device_type", None)
    name = type(device).__qualname__
    who = f"{entry.human_name} {entry.name!r} from plugin {entry.plugin!r}"
    if not isinstance(device_type, str) or not device_type:
        raise PluginError(
            f"{who}: {name}.torch_device_type is {device_type!r}; set it to the device type "
            "torch knows the device by ('cuda', 'npu', 'cpu', or the type its torch extension "
            "registers)"
        )
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PluginError(
            f"{who}: torch.device({device_type!r}) fails ({reason}); set "
            f"{name}.torch_device_type to the device type torch knows it by (the one its torch "
            "extension registers, imported when the device is built), not the registered name"
        ) from None


def build_part(kind: str, name: str, config: Any, context: Any) -> Any:
    """The part registered as ``name`` of ``kind``, built as ``cls(config, context)`` with the
    registry of ``context.plugins``, the run's plugin manager. ``context`` is
    a :class:`PartContext`, or the :class:`~plugrl.run.runner.RunContext` for a scheduler."""
    plugins = context.plugins
    if plugins is None:
        raise ValueError(
            f"building the {kind} {name!r} needs the run's plugin manager in context.plugins"
        )
    entry = plugins.registry(kind).get(name)
    cls = entry.load()
    check_constructor(entry, cls)
    return cls(config, context)


def build_estimator(recipe: Recipe, plugins: PluginManager) -> AdvantageEstimator:
    """The estimator ``algorithm.adv_estimator`` names, with its
    ``algorithm.adv_estimator_args``."""
    options = part_args(recipe, "algorithm", "adv_estimator_args", plugins)
    context = PartContext(recipe=recipe, plugins=plugins, options=options)
    return build_part(
        "advantage_estimators", recipe.algorithm.adv_estimator, recipe.algorithm, context
    )


def build_policy_loss(recipe: Recipe, plugins: PluginManager) -> PolicyLoss:
    """The loss ``actor.policy_loss`` names, with its ``actor.policy_loss_args``."""
    options = part_args(recipe, "actor", "policy_loss_args", plugins)
    context = PartContext(recipe=recipe, plugins=plugins, options=options)
    return build_part("policy_losses", recipe.actor.policy_loss, recipe.actor, context)


def part_args(recipe: Recipe, section_name: str, args_key: str, plugins: PluginManager) -> Any:
    """The chosen part's args (``algorithm.adv_estimator_args``) as its config object, or
    ``None`` when the part registered no config class."""
    dotted = f"{section_name}.{args_key}"
    kind = next((k for k in PART_KINDS.values() if k.args_key == dotted), None)
    if kind is None:
        raise ValueError(f"{dotted} is not the options key of any kind of part")
    owner = getattr(recipe, section_name)
    config_cls = plugins.registry(kind.name).get(dotted_get(owner, kind.selector)).load_config()
    if config_cls is None:
        return None
    return structure(config_cls, dict(dotted_get(owner, args_key)), dotted)


def dotted_get(config: Any, dotted: str) -> Any:
    """The option at ``dotted`` (``"agent.loop"``) within a config object."""
    for name in dotted.split("."):
        config = getattr(config, name)
    return config
