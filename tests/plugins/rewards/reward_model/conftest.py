"""Fixtures of the reward_model tests: a tiny reward model folder, the run's tokenizer, and
managers built from recipes the way a run builds them."""

from __future__ import annotations

import pytest

from plugrl.compose.run_parts import build_reward_manager
from plugrl.testing import make_tiny_tokenizer, save_tiny_reward_model
from tests.plugins.rewards.reward_model.rm_testlib import SMALL


@pytest.fixture(scope="module")
def rm_folder(plugrl_build_once):
    return plugrl_build_once(save_tiny_reward_model, seed=0, **SMALL)


@pytest.fixture(scope="module")
def policy_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def build(make_recipe, policy_tokenizer, plugins):
    """build(**reward keys) -> a reward_model manager; closed after the test."""
    built = []

    def make(**reward):
        recipe = make_recipe({"manager": "reward_model", **reward})
        manager = build_reward_manager(recipe, policy_tokenizer, plugins)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()
