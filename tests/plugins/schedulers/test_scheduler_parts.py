import logging

import pytest

from plugrl.recipe import build_recipe
from plugrl_plugins.schedulers.parts import training_loader


class Prompts(list):
    files_key = "data.train_files"


def recipe_with(**data):
    filter_groups = data.pop("filter_groups", False)
    return build_recipe(
        {
            "data": {"train_batch_size": 4, **data},
            "rollout": {"n": 2},
            "algorithm": {"filter_groups": {"enable": filter_groups}},
        }
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


def test_gen_batch_size_without_dynamic_sampling_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="plugrl.run"):
        loader = training_loader(recipe_with(gen_batch_size=6), Prompts(range(16)), 0)
    assert loader.batch_size == 4
    assert caplog.messages == [
        "data.gen_batch_size is used only with algorithm.filter_groups.enable=true; each step "
        "generates data.train_batch_size=4 prompts"
    ]
