"""The plugin manager: finds plugins through the ``plugrl`` entry-point group and holds the
registries their registration hooks fill.

It is the only global state in plugrl (:func:`get_plugin_manager`). Built-in plugins are entry
points of the ``plugrl`` distribution, loaded the same way as third-party ones.

Environment controls (read when the manager loads):

* ``PLUGRL_DISABLE_PLUGIN_AUTOLOAD=1``: load only the built-in plugins, plus those named in
  ``PLUGRL_LOAD_PLUGINS``.
* ``PLUGRL_LOAD_PLUGINS=a,b``: of the third-party plugins, load only these (entry-point or
  distribution names). Set but empty: none.
* ``PLUGRL_DISABLED_PLUGINS=a,b``: never load these, built-ins included, except the ones a
  run cannot do without (:data:`ESSENTIAL_PLUGINS`).
* ``PLUGRL_STRICT_PLUGINS=1``: a plugin that fails to import, or implements a hook that does
  not exist, raises. Without it, the first is skipped with a warning, and the second loads
  with a warning: the functions that are not plugrl hooks are never called.
"""

from __future__ import annotations

import difflib
import logging
import os
import types
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

import attrs
import pluggy

from plugrl import ENTRY_POINT_GROUP, PROJECT_NAME
from plugrl.errors import PluginError
from plugrl.plugin import hookspecs
from plugrl.plugin.registry import PART_KINDS, Registry, bound_register

logger = logging.getLogger("plugrl.plugins")

CORE_DISTRIBUTION = "plugrl"

ESSENTIAL_PLUGINS: dict[str, str] = {
    "cpu": "the device every run can fall back to",
    "sync": "the default scheduler",
    "transports": "how weights reach the engines",
}
"""Built-in plugins (entry points of the ``plugrl`` distribution) that
``PLUGRL_DISABLED_PLUGINS`` cannot remove, with what each provides."""
_TRUE = {"1", "true", "yes", "on"}


def _env_flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in _TRUE


def _env_list(environ: Mapping[str, str], name: str) -> list[str] | None:
    if name not in environ:
        return None
    return [item.strip() for item in environ[name].split(",") if item.strip()]


@attrs.frozen
class PluginSource:
    """Where a plugin came from: an entry point, or registered in-process (``entry_point=None``)."""

    name: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    @property
    def builtin(self) -> bool:
        return self.distribution == CORE_DISTRIBUTION


@attrs.frozen
class LoadFailure:
    """A plugin that was found but could not be used."""

    name: str
    distribution: str | None
    version: str | None
    entry_point: str | None
    error: str

    def message(self) -> str:
        source = PluginSource(self.name, self.distribution, self.version, self.entry_point)
        return f"plugin {self.name!r} ({_origin(source)}) skipped: {self.error}"


def _origin(source: PluginSource) -> str:
    """``entry point, from distribution version`` for messages about a plugin."""
    dist = f"{source.distribution} {source.version}" if source.distribution else "no distribution"
    return f"{source.entry_point or 'in-process'}, from {dist}"


def iter_entry_points() -> Iterable[Any]:
    """The installed entry points of the ``plugrl`` group (``plugrl.testing`` can fake these)."""
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


class PluginManager:
    """Wraps a :class:`pluggy.PluginManager` with plugrl's loading rules and registries."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.sources: dict[str, PluginSource] = {}
        self.failures: list[LoadFailure] = []
        self.warnings: dict[str, list[str]] = {}
        """What is wrong with plugins that loaded anyway, by plugin name (hooks plugrl does not
        define, which are never called)."""
        self.blocked: list[str] = []
        self._registries: dict[str, Registry] = {}
        self.prepared: dict[tuple[str, str, str], list[str]] = {}
        """(kind, device, part) whose ``prepare_backend`` / ``prepare_rollout`` hook already
        ran in this process, with what the plugins said they patched."""
        self.strict = _env_flag(self.environ, "PLUGRL_STRICT_PLUGINS")

    # ---------------------------------------------------------------------------- loading

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def load_entry_points(self, entry_points: Iterable[Any] | None = None) -> None:
        """Load plugins from entry points, honouring the environment controls."""
        autoload = not _env_flag(self.environ, "PLUGRL_DISABLE_PLUGIN_AUTOLOAD")
        only = _env_list(self.environ, "PLUGRL_LOAD_PLUGINS")
        disabled = set(_env_list(self.environ, "PLUGRL_DISABLED_PLUGINS") or [])
        seen: set[tuple[str, str]] = set()
        found_names: set[str] = set()
        eps = iter_entry_points() if entry_points is None else entry_points
        for ep in sorted(eps, key=lambda e: (not _is_builtin(e), e.name)):
            if (ep.name, ep.value) in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            dist_name, dist_version = _distribution_of(ep)
            found_names.update({ep.name, dist_name or ""})
            if ep.name in disabled or (dist_name and dist_name in disabled):
                if dist_name == CORE_DISTRIBUTION and ep.name in ESSENTIAL_PLUGINS:
                    logger.warning(
                        "warning: PLUGRL_DISABLED_PLUGINS names plugin %r (%s), which plugrl "
                        "cannot run without; it stays loaded",
                        ep.name,
                        ESSENTIAL_PLUGINS[ep.name],
                    )
                else:
                    self.blocked.append(ep.name)
                    self.pm.set_blocked(ep.name)
                    continue
            if dist_name != CORE_DISTRIBUTION:
                named = ep.name in (only or []) or dist_name in (only or [])
                if only is not None and not named:
                    continue
                if not autoload and not named:
                    continue
            source = PluginSource(ep.name, dist_name, dist_version, ep.value)
            try:
                plugin = ep.load()
            except Exception as exc:
                self._fail(source, f"{type(exc).__name__}: {exc}", exc)
                continue
            self.register(plugin, source=source)
        for name in only or []:
            if name not in found_names:
                logger.warning(
                    "PLUGRL_LOAD_PLUGINS names %r, but no installed plugin has that name", name
                )

    def register(
        self, plugin: object, name: str | None = None, *, source: PluginSource | None = None
    ) -> str | None:
        """Register a plugin object (a module, class or instance with hook implementations).

        Returns its name, or ``None`` if it was blocked or invalid (reported as a failure).
        """
        source = source or PluginSource(name or _default_name(plugin))
        if self.pm.is_blocked(source.name):
            return None
        try:
            registered = self.pm.register(plugin, name=source.name)
        except pluggy.PluginValidationError as exc:
            self._fail(source, str(exc), exc)
            return None
        except ValueError as exc:  # pluggy: name or object already registered
            raise PluginError(f"plugin {source.name!r} cannot be registered: {exc}") from exc
        if registered is None:
            return None
        self.sources[source.name] = source
        self._registries.clear()
        self._check_unknown_hooks(registered, plugin, source)
        return registered

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.sources.pop(name, None)
        self.warnings.pop(name, None)
        self._registries.clear()

    def _check_unknown_hooks(self, name: str, plugin: object, source: PluginSource) -> None:
        """Report hook implementations whose name is not a plugrl hook (pluggy's
        ``check_pending``): a typo, or a hook of a newer plugrl."""
        unknown = sorted(
            caller.name for caller in self.pm.get_hookcallers(plugin) or [] if not caller.has_spec()
        )
        if not unknown:
            return
        known = sorted(
            name
            for name in dir(self.pm.hook)
            if not name.startswith("_") and getattr(self.pm.hook, name).has_spec()
        )
        guesses = [
            f"{name} -> {close[0]}"
            for name in unknown
            if (close := difflib.get_close_matches(name, known, n=1, cutoff=0.75))
        ]
        hint = f"did you mean {', '.join(guesses)}? " if guesses else ""
        functions = "that function is" if len(unknown) == 1 else "those functions are"
        problem = (
            f"implements {', '.join(unknown)}, which plugrl {_plugrl_version()} does not define"
        )
        where = _origin(source)
        if self.strict:
            raise PluginError(
                f"plugin {source.name!r} ({where}) failed: {problem}; {hint}hooks: "
                f"{', '.join(known)}"
            )
        warning = f"{problem}: {functions} never called; {hint}hooks: {', '.join(known)}"
        self.warnings.setdefault(source.name, []).append(warning)
        logger.warning("warning: plugin %r (%s) loads, but %s", source.name, where, warning)

    def _fail(self, source: PluginSource, error: str, exc: BaseException) -> None:
        failure = LoadFailure(
            source.name, source.distribution, source.version, source.entry_point, error
        )
        if self.strict:
            raise PluginError(failure.message().replace("skipped", "failed")) from exc
        if self.pm.has_plugin(source.name):
            self.unregister(source.name)
        self.failures.append(failure)
        logger.warning("warning: %s", failure.message())

    # ---------------------------------------------------------------------------- registries

    def registry(self, kind: str) -> Registry:
        """The registry of ``kind`` (see :data:`plugrl.plugin.registry.PART_KINDS`), filled on
        first use by calling every plugin's registration hook."""
        if kind not in self._registries:
            registry = Registry(kind)  # refuses an unknown kind
            hook_name = PART_KINDS[kind].hook
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                register = bound_register(registry, impl.plugin_name)
                try:
                    impl.function(register=register)
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(
                        f"plugin {impl.plugin_name!r} failed in {hook_name}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            self._registries[kind] = registry
        return self._registries[kind]

    def registries(self) -> dict[str, Registry]:
        return {kind: self.registry(kind) for kind in PART_KINDS}

    # ---------------------------------------------------------------------------- reporting

    def describe(self, include_all: bool = False) -> list[dict[str, Any]]:
        """One dict per plugin: name, distribution, version, hooks, registered names."""
        registered: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for kind, registry in self.registries().items():
            for entry in registry:
                registered.setdefault(entry.plugin, {}).setdefault(kind, []).append(
                    entry.describe()
                )
        rows = []
        for name, plugin in sorted(self.pm.list_name_plugin(), key=lambda item: item[0]):
            if plugin is None:
                continue
            source = self.sources.get(name, PluginSource(name))
            hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
            parts = registered.get(name, {})
            entries = [entry for entries in parts.values() for entry in entries]
            rows.append(
                {
                    "name": name,
                    "distribution": source.distribution,
                    "version": source.version,
                    "entry_point": source.entry_point,
                    "builtin": source.builtin,
                    "status": "loaded",
                    "warnings": list(self.warnings.get(name, [])),
                    "hooks": hooks,
                    "registers": parts,
                    "available": all(entry["available"] for entry in entries),
                }
            )
        if include_all:
            for failure in self.failures:
                rows.append(
                    {
                        "name": failure.name,
                        "distribution": failure.distribution,
                        "version": failure.version,
                        "entry_point": failure.entry_point,
                        "builtin": failure.distribution == CORE_DISTRIBUTION,
                        "status": "failed",
                        "error": failure.error,
                        "hooks": [],
                        "registers": {},
                        "available": False,
                    }
                )
            for name in self.blocked:
                rows.append(
                    {
                        "name": name,
                        "status": "disabled",
                        "hooks": [],
                        "registers": {},
                        "available": False,
                    }
                )
        return rows


def _is_builtin(ep: Any) -> bool:
    return _distribution_of(ep)[0] == CORE_DISTRIBUTION


def _distribution_of(ep: Any) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    name = dist.metadata["Name"] if hasattr(dist, "metadata") else getattr(dist, "name", None)
    return name, getattr(dist, "version", None)


def _default_name(plugin: object) -> str:
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    return getattr(plugin, "__name__", None) or type(plugin).__name__


def _plugrl_version() -> str:
    from plugrl import __version__

    return __version__


# -------------------------------------------------------------------------------- the global

_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process's plugin manager, created and loaded from entry points on first use."""
    global _manager
    if _manager is None:
        manager = PluginManager()
        manager.load_entry_points()
        _manager = manager
    return _manager


def set_plugin_manager(manager: PluginManager | None) -> PluginManager | None:
    """Replace the process's plugin manager (tests use this); returns the previous one."""
    global _manager
    previous, _manager = _manager, manager
    return previous


def registry(kind: str) -> Registry:
    """Shortcut for ``get_plugin_manager().registry(kind)``."""
    return get_plugin_manager().registry(kind)


def load_part(kind: str, name: str) -> Callable[..., Any] | Any:
    """Import and return the class or function registered as ``name`` of ``kind``."""
    return registry(kind).load(name)
