"""Options that hold paths are marked so; a recipe comes back from reading with them absolute,
against the working folder of the process that read it."""

import os

import pytest

from plugrl.config import option
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import (
    Recipe,
    apply_overrides,
    build_recipe,
    path_keys,
    path_options,
    resolve_paths,
)
from plugrl.recipe.sections import ModelConfig, TrainerConfig


def build(*overrides):
    return build_recipe(apply_overrides({}, overrides), get_plugin_manager())


def test_relative_paths_are_taken_from_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = build(
        "model.path=models/m",
        "data.train_files=[data/a.parquet, /srv/b.parquet]",
        "data.val_files=[./data/../data/v.parquet]",
        "reward.custom_function.path=score.py",
        "trainer.default_local_dir=runs/x",
        "trainer.rollout_data_dir=~/dumps",
        "trainer.validation_data_dir=hdfs://cluster/val",
        "trainer.resume_mode=runs/x/global_step_2",
    )
    assert recipe.model.path == str(tmp_path / "models" / "m")
    assert recipe.model.tokenizer_path is None
    assert recipe.data.train_files == [str(tmp_path / "data" / "a.parquet"), "/srv/b.parquet"]
    assert recipe.data.val_files == [str(tmp_path / "data" / "v.parquet")]
    assert recipe.reward.custom_function.path == str(tmp_path / "score.py")
    assert recipe.trainer.default_local_dir == str(tmp_path / "runs" / "x")
    assert recipe.trainer.rollout_data_dir == os.path.expanduser("~/dumps")
    assert recipe.trainer.validation_data_dir == "hdfs://cluster/val"  # a URL stays as it is
    assert recipe.trainer.resume_mode == str(tmp_path / "runs" / "x" / "global_step_2")
    # read again elsewhere (a recorded recipe), the absolute paths stay
    monkeypatch.chdir(tmp_path / "..")
    assert resolve_paths(recipe) == recipe


def test_the_words_of_a_path_option_are_not_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert build("trainer.resume_mode=auto").trainer.resume_mode == "auto"
    assert build("trainer.resume_mode=disable").trainer.resume_mode == "disable"


def test_plugin_and_component_paths_are_resolved_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = build(
        "reward.custom_function.path=score.py",
        "reward.components.rule.weight=1.0",
        "reward.components.rm.weight=0.5",
        "reward.components.rm.manager=reward_model",
        "reward.components.rm.model.path=rm",
    )
    components = recipe.reward.components
    # the inherited custom function, and the reward-model manager's own model folder
    assert components["rule"]["custom_function"]["path"] == str(tmp_path / "score.py")
    assert components["rm"]["model"]["path"] == str(tmp_path / "rm")
    judged = build("reward.manager=judge", "reward.judge.model.path=judge")
    assert judged.reward.judge.model.path == str(tmp_path / "judge")
    by_key = {o.key: o for o in path_options(recipe, get_plugin_manager())}
    assert by_key["reward.components.rm.model.path"].kind == "model"
    assert by_key["reward.components.rm.model.path"].paths == (str(tmp_path / "rm"),)
    assert by_key["model.path"].paths == ()


def test_every_path_option_of_the_core_is_known():
    assert path_keys(Recipe()) == {
        "model.path",
        "model.tokenizer_path",
        "model.lora_adapter_path",
        "data.train_files",
        "data.val_files",
        "critic.model_path",
        "reward.custom_function.path",
        "rollout.agent.tool_config_path",
        "trainer.default_local_dir",
        "trainer.resume_mode",
        "trainer.rollout_data_dir",
        "trainer.validation_data_dir",
    }


def test_a_recipe_built_in_python_is_resolved_on_a_copy(tmp_path):
    recipe = Recipe(model=ModelConfig(path="m"), trainer=TrainerConfig(resume_mode="auto"))
    resolved = resolve_paths(recipe, base=tmp_path)
    assert resolved.model.path == str(tmp_path / "m")
    assert resolved.trainer.resume_mode == "auto"
    assert recipe.model.path == "m"


def test_a_path_option_names_a_known_kind():
    with pytest.raises(ValueError, match="path must be one of model, input, output, not 'dir'"):
        option(None, "A folder.", path="dir")
