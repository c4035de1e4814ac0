"""Fixtures of the algorithm tests (the algorithm plugins and the core's composition of them):
a plugin manager with the estimators, policy losses and KL penalties, plus stand-ins for the
parts a default recipe names that live in other plugins (backend, rollout, reward manager,
scheduler, agent loop, tool-call parser)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import plugrl
import plugrl_console
import plugrl_cpu
import plugrl_estimators
import plugrl_jsonl
import plugrl_kl_penalties
import plugrl_policy_losses
from plugrl.parts.scheduler import Scheduler
from plugrl.plugin.manager import PluginManager, set_plugin_manager
from plugrl.recipe import Recipe, apply_overrides, build_recipe


class UndeclaredScheduler(Scheduler):
    """Says nothing about the optional columns it produces."""

    def train_step(self, parts: Any, step: int) -> dict[str, Any]:
        raise AssertionError("not run in these tests")


class PlainScheduler(UndeclaredScheduler):
    provides = frozenset({"values"})


class BaselineScheduler(UndeclaredScheduler):
    provides = frozenset({"values", "reward_baselines"})


class StandInParts:
    @plugrl.hookimpl
    def register_training_backends(self, register):
        register("fsdp2", object)

    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        register("hf", object)

    @plugrl.hookimpl
    def register_reward_managers(self, register):
        register("naive", object)

    @plugrl.hookimpl
    def register_agent_loops(self, register):
        register("single_turn", object)

    @plugrl.hookimpl
    def register_tool_parsers(self, register):
        register("hermes", object)

    @plugrl.hookimpl
    def register_schedulers(self, register):
        register("sync", UndeclaredScheduler)
        register("plain", PlainScheduler)
        register("with_baselines", BaselineScheduler)


def make_plugins() -> PluginManager:
    manager = PluginManager(environ={})
    for plugin in (plugrl_estimators, plugrl_policy_losses, plugrl_kl_penalties):
        manager.register(plugin, name=plugin.__name__)
    manager.register(plugrl_cpu, name="cpu")
    manager.register(plugrl_console, name="console")
    manager.register(plugrl_jsonl, name="jsonl")
    manager.register(StandInParts(), name="stand-ins")
    return manager


@pytest.fixture(scope="session")
def plugins() -> PluginManager:
    return make_plugins()


@pytest.fixture
def global_plugins(plugins: PluginManager) -> Iterator[PluginManager]:
    """Make ``plugins`` the process's manager (what a worker resolves parts from)."""
    previous = set_plugin_manager(plugins)
    try:
        yield plugins
    finally:
        set_plugin_manager(previous)


@pytest.fixture
def recipe_from(plugins: PluginManager):
    def build(*overrides: str) -> Recipe:
        return build_recipe(apply_overrides({}, overrides), plugins)

    return build
