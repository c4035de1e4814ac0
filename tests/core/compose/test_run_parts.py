import pytest

from plugrl.compose.run_parts import training_loader, update_derives_old_log_probs
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe


class Prompts(list):
    files_key = "data.train_files"


def recipe_with(**data):
    filter_groups = data.pop("filter_groups", False)
    return build_recipe(
        {
            "data": {"train_batch_size": 4, **data},
            "actor": {"ppo_mini_batch_size": 4},
            "rollout": {"n": 2},
            "algorithm": {"filter_groups": {"enable": filter_groups}},
        },
        get_plugin_manager(),
    )


@pytest.mark.parametrize(
    ("data", "batch_size"),
    [
        ({}, 4),
        ({"gen_batch_size": 4}, 4),
        ({"gen_batch_size": 6, "filter_groups": True}, 6),
    ],
)
def test_the_training_loader_batches_prompts_per_generation_round(data, batch_size):
    assert training_loader(recipe_with(**data), Prompts(range(16)), 0).batch_size == batch_size


def test_gen_batch_size_without_dynamic_sampling_is_ignored():
    # the recipe check warns about it (tests/core/test_recipe_checks.py)
    loader = training_loader(recipe_with(gen_batch_size=6), Prompts(range(16)), 0)
    assert loader.batch_size == 4


class Derives:
    derives_on_policy_old_log_probs = True


class Grpo:
    requires = ("token_level_rewards", "response_mask")


class NeedsOldLogProbs:
    requires = ("token_level_rewards", "response_mask", "old_log_probs")


def on_policy_recipe(**sections):
    base = {
        "data": {"train_batch_size": 4},
        "actor": {"ppo_mini_batch_size": 4, "ppo_epochs": 1},
        "rollout": {"n": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return build_recipe(base, get_plugin_manager())


def test_an_exactly_on_policy_update_derives_its_old_log_probs():
    assert update_derives_old_log_probs(on_policy_recipe(), Derives, Grpo())


@pytest.mark.parametrize(
    ("sections", "backend", "estimator"),
    [
        ({"actor": {"ppo_epochs": 2}}, Derives, Grpo()),
        ({"actor": {"ppo_mini_batch_size": 2}}, Derives, Grpo()),
        ({"actor": {"reuse_on_policy_log_prob": False}}, Derives, Grpo()),
        ({"algorithm": {"use_kl_in_reward": True}}, Derives, Grpo()),
        ({}, object, Grpo()),
        ({}, Derives, NeedsOldLogProbs()),
    ],
    ids=[
        "two-epochs",
        "two-mini-batches",
        "switched-off",
        "kl-in-reward",
        "backend-cannot",
        "estimator-reads-them",
    ],
)
def test_otherwise_the_scheduler_computes_old_log_probs(sections, backend, estimator):
    assert not update_derives_old_log_probs(on_policy_recipe(**sections), backend, estimator)
