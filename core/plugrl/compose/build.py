"""Building one part: load the class a plugin registered, check that it fits its interface,
and construct it as ``cls(config, context)``."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from plugrl.errors import PluginError
from plugrl.parts.context import PartContext
from plugrl.plugins import get_plugin_manager
from plugrl.recipe import part_args
from plugrl.registry import PART_KINDS, import_object

if TYPE_CHECKING:
    from plugrl.parts.algorithm import AdvantageEstimator, PolicyLoss
    from plugrl.parts.device import Device
    from plugrl.plugins import PluginManager
    from plugrl.recipe import Recipe
    from plugrl.registry import Entry


def check_constructor(entry: Entry, cls: Any) -> None:
    """Raise a one-line :class:`PluginError` when ``cls`` does not fit the interface of its
    kind: not a subclass of it, not callable as ``cls(config, context)``, or a method it
    overrides that the core could not call as it calls the interface's (other parameters, or
    ``def`` where the interface has ``async def``)."""
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


def _interface_methods(interface: type) -> list[tuple[str, Any]]:
    """The public methods an interface declares (its own and its bases')."""
    methods = {}
    for klass in reversed(interface.__mro__[:-1]):
        for method, value in vars(klass).items():
            if not method.startswith("_") and inspect.isfunction(value):
                methods[method] = value
    return sorted(methods.items())


def _check_method(who: str, cls: type, interface: type, method: str, expected: Any) -> None:
    actual = inspect.getattr_static(cls, method, None)
    if actual is expected or not inspect.isfunction(actual):
        return
    want = inspect.signature(expected)
    have = inspect.signature(actual)
    call_args: list[Any] = []
    call_kwargs: dict[str, Any] = {}
    # required parameters are passed by position, optional ones by name, as the core does
    for parameter in want.parameters.values():
        optional = parameter.default is not parameter.empty
        if parameter.kind is parameter.POSITIONAL_ONLY or (
            parameter.kind is parameter.POSITIONAL_OR_KEYWORD and not optional
        ):
            call_args.append(object())
        elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            call_kwargs[parameter.name] = object()
    problem = None
    if inspect.iscoroutinefunction(expected) != inspect.iscoroutinefunction(actual):
        problem = "async def" if inspect.iscoroutinefunction(expected) else "a plain def"
        problem = f"must be {problem}"
    else:
        try:
            have.bind(*call_args, **call_kwargs)
        except TypeError:
            problem = "takes other parameters"
    if problem:
        raise PluginError(
            f"{who}: {cls.__qualname__}.{method}{have} does not fit the interface, which has "
            f"{interface.__name__}.{method}{want} ({problem}); fix it (see docs/plugins.md)"
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
