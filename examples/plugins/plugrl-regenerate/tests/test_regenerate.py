"""Tests of plugrl-regenerate, run against the installed package with plugrl's test kit
(``pip install .`` then ``pytest`` in this folder): the group test on a made-up batch, and
whole runs through plugrl's run loop on the simulated parts that come with plugrl."""

import json

import pytest

import plugrl_regenerate
from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.run.runner import run_recipe
from plugrl.testing import make_batch
from plugrl_regenerate.scheduler import RegenerateScheduler, flat_groups
from plugrl_sim.parts import build_sim_task, sim_recipe


def test_the_installed_package_registers_regenerate(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(plugrl_regenerate)
    row = next(r for r in plugrl_plugin_manager.describe() if r["name"] == "regenerate")
    assert row["distribution"] == "plugrl-regenerate"
    assert plugrl_plugin_manager.registry("schedulers").load("regenerate") is RegenerateScheduler


def test_flat_groups_are_the_prompts_whose_responses_scored_the_same():
    batch = make_batch((3, 4, 5), n=2, scores=[1, 1, 0, 1, 0, 0])
    assert flat_groups(batch) == {"uid-0", "uid-2"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_sim_task(tmp_path_factory.mktemp("task"), num_train=32, num_val=4)


def run(task, folder, plugrl_recipe, max_rounds):
    data = sim_recipe(task, folder, scheduler="regenerate", steps=3, n=2, train_batch_size=8)
    data["scheduler"]["max_rounds"] = max_rounds
    run_recipe(plugrl_recipe(data), get_plugin_manager())
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_run_samples_the_flat_groups_again(task, tmp_path, plugrl_recipe):
    steps = run(task, tmp_path / "run", plugrl_recipe, max_rounds=3)
    assert [step["step"] for step in steps] == [1, 2, 3]
    before = sum(step["regenerate/flat_groups"] for step in steps)
    after = sum(step["regenerate/flat_groups_trained"] for step in steps)
    assert before > 0  # the simulated reward is a coin flip per response: some groups are flat
    assert after < before
    assert all(step["critic/score/mean"] >= 0 for step in steps)


def test_no_rounds_trains_the_groups_as_sampled(task, tmp_path, plugrl_recipe):
    steps = run(task, tmp_path / "run", plugrl_recipe, max_rounds=0)
    assert all(
        step["regenerate/flat_groups"] == step["regenerate/flat_groups_trained"] for step in steps
    )


def test_a_negative_round_count_is_refused_in_one_line(task, tmp_path, plugrl_recipe):
    data = sim_recipe(task, tmp_path / "run", scheduler="regenerate")
    data["scheduler"]["max_rounds"] = -1
    with pytest.raises(RecipeError) as error:
        plugrl_recipe(data)
    assert str(error.value).startswith("scheduler.max_rounds: must be >= 0")
