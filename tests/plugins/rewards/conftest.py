"""Fixtures for the rewards plugin: recipes built through the real recipe code, a tokenizer,
files holding scoring functions."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plugrl.plugins import PluginManager, set_plugin_manager
from plugrl.recipe import build_recipe

sys.path.insert(0, str(Path(__file__).parent))

import rewards_stub_parts
from rewards_testlib import CharTokenizer


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def plugins():
    """The installed built-in plugins plus stand-ins for the non-reward parts."""
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    manager.register(rewards_stub_parts, "rewards-test-stubs")
    previous = set_plugin_manager(manager)
    yield manager
    set_plugin_manager(previous)


STUB_SECTIONS = {
    "device": {"name": "cpu"},
    "actor": {
        "backend": "rewards_test_backend",
        "policy_loss": "rewards_test_loss",
        "kl_loss_type": "rewards_test_kl",
    },
    "rollout": {"engine": "rewards_test_engine"},
    "algorithm": {"adv_estimator": "rewards_test_estimator", "kl_penalty": "rewards_test_kl"},
    "scheduler": {"name": "rewards_test_scheduler"},
}


@pytest.fixture
def make_recipe(plugins) -> Callable[..., Any]:
    """make_recipe(reward={...}, max_response_length=...) -> a validated Recipe."""

    def make(reward: dict[str, Any] | None = None, max_response_length: int = 64) -> Any:
        raw = {**STUB_SECTIONS, "reward": reward or {}}
        raw["data"] = {"max_response_length": max_response_length}
        return build_recipe(raw, plugins)

    return make


@pytest.fixture
def scorer_file(tmp_path) -> Callable[[str, str], Path]:
    """scorer_file(code, name="reward.py") -> path of a Python file holding ``code``."""

    def write(code: str, name: str = "reward.py") -> Path:
        path = tmp_path / name
        path.write_text(code, encoding="utf-8")
        return path

    return write
