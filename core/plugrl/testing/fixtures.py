"""The pytest plugin of plugrl (loaded automatically once plugrl is installed).

Fixtures:

* ``plugrl_plugin_manager``: a fresh plugin manager with the installed plugins loaded, set as
  the process's manager for the duration of the test (so ``load_recipe`` and the CLI's
  in-process functions see it), then the previous one is restored.
* ``plugrl_make_plugin_manager``: a factory for the same, taking ``environ`` (to test
  ``PLUGRL_*`` controls) and ``entry_points`` (None: installed ones plus fakes).
* ``plugrl_register_plugin``: ``register(obj, name=None)`` puts a plugin object (module, class
  or instance with ``@plugrl.hookimpl`` functions) into the current manager; it is
  unregistered after the test. An object already registered (an installed plugin, from its
  entry point) stays as it is, under its entry-point name.
* ``plugrl_fake_entry_point``: ``fake(name, target, dist="fake-dist", version="0.0.1")`` makes an
  entry point visible to managers created afterwards, as if a distribution declared it;
  ``target`` is an object or a ``"module"``/``"module:attr"`` path, imported on load (a path to
  a module that does not exist simulates a broken plugin).

* ``plugrl_recipe``: ``make(overrides=None, *, base=None)``, :func:`make_recipe` with the
  test's plugin manager (``plugrl_plugin_manager``, with what ``plugrl_register_plugin``
  added).

* ``plugrl_build_once`` (session): ``build(builder, *args, **kwargs)``,
  :func:`~plugrl.testing.shared.build_once` in a folder of the test session that its
  pytest-xdist workers share: ``builder(folder, *args, **kwargs)`` runs once per session for
  the same arguments, whichever process asks first, e.g.
  ``plugrl_build_once(save_tiny_model, seed=0)`` in a session-scoped fixture.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from plugrl.plugin import manager as plugins_module
from plugrl.plugin.manager import PluginManager, set_plugin_manager
from plugrl.testing import FakeEntryPoint, make_fake_entry_point, make_recipe
from plugrl.testing.shared import build_once

if TYPE_CHECKING:
    from plugrl.recipe import Recipe


@pytest.fixture
def plugrl_fake_entry_point(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeEntryPoint]:
    fakes: list[FakeEntryPoint] = []
    installed = plugins_module.iter_entry_points

    def all_entry_points() -> list[Any]:
        return [*installed(), *fakes]

    monkeypatch.setattr(plugins_module, "iter_entry_points", all_entry_points)

    def fake(
        name: str, target: Any, dist: str = "fake-dist", version: str = "0.0.1"
    ) -> FakeEntryPoint:
        entry_point = make_fake_entry_point(name, target, dist, version)
        fakes.append(entry_point)
        return entry_point

    return fake


@pytest.fixture
def plugrl_make_plugin_manager() -> Iterator[Callable[..., PluginManager]]:
    previous = set_plugin_manager(None)

    def make(
        environ: Mapping[str, str] | None = None, entry_points: list[Any] | None = None
    ) -> PluginManager:
        manager = PluginManager(environ=environ)
        manager.load_entry_points(entry_points)
        set_plugin_manager(manager)
        return manager

    try:
        yield make
    finally:
        set_plugin_manager(previous)


@pytest.fixture
def plugrl_plugin_manager(
    plugrl_make_plugin_manager: Callable[..., PluginManager],
) -> PluginManager:
    return plugrl_make_plugin_manager()


@pytest.fixture
def plugrl_recipe(plugrl_plugin_manager: PluginManager) -> Callable[..., Recipe]:
    def make(
        overrides: Mapping[str, Any] | None = None,
        *,
        base: Mapping[str, Any] | str | Path | None = None,
    ) -> Recipe:
        return make_recipe(overrides, base=base, plugins=plugrl_plugin_manager)

    return make


@pytest.fixture
def plugrl_register_plugin(
    plugrl_plugin_manager: PluginManager,
) -> Iterator[Callable[..., str | None]]:
    registered: list[str] = []

    def register(plugin: object, name: str | None = None) -> str | None:
        # an installed plugin is already registered from its entry point: use that one (a
        # plugin tested the same way installed or not)
        if plugrl_plugin_manager.pm.is_registered(plugin):
            return plugrl_plugin_manager.pm.get_name(plugin)
        registered_name = plugrl_plugin_manager.register(plugin, name)
        if registered_name is not None:
            registered.append(registered_name)
        return registered_name

    try:
        yield register
    finally:
        for name in registered:
            if plugrl_plugin_manager.pm.has_plugin(name):
                plugrl_plugin_manager.unregister(name)


@pytest.fixture(scope="session")
def plugrl_build_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    base = tmp_path_factory.getbasetemp()
    # under pytest-xdist each worker's base folder sits in the session's, which all share
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = session / "plugrl-build-once"

    def build(builder: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return build_once(root, builder, *args, **kwargs)

    return build
