"""A run folder that holds a checkpoint is resumed only by a recipe of the same experiment:
another one stops before anything starts, with the keys that differ and the ways on."""

import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from plugrl.errors import DataError, RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.folder import (
    NOT_EXPERIMENT_KEYS,
    check_resume,
    describe_changes,
    recipe_changes,
)
from plugrl.run.runner import run_recipe
from plugrl_sim.parts import sim_recipe


@pytest.fixture(scope="module")
def task(sim_task):
    return sim_task


def sim_run(task, run_dir, *, steps=2, **sections):
    """A recipe of the simulated parts that saves a checkpoint every step; ``sections`` merge
    into the recipe's sections."""
    raw = sim_recipe(task, run_dir, steps=steps, train_batch_size=4, n=2, max_response_length=16)
    raw["trainer"]["save_freq"] = 1
    raw["rollout"].update(sim_step_ms=0.0, sim_token_ms=0.0)
    raw["actor"].update(sim_train_ms_per_ktoken=0.0, sim_forward_ms_per_ktoken=0.0)
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return build_recipe(raw, get_plugin_manager())


def folder_state(run_dir):
    """Every file of the folder with its content, to show that nothing was written."""
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def logged_steps(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.fixture
def finished(task, tmp_path):
    """A finished two-step run with checkpoints of both steps."""
    run_dir = tmp_path / "run"
    run_recipe(sim_run(task, run_dir), get_plugin_manager())
    assert (run_dir / "global_step_2").is_dir() and logged_steps(run_dir) == [1, 2]
    return run_dir


def test_another_experiment_in_the_folder_stops_before_anything_starts(task, finished):
    before = folder_state(finished)
    changed = sim_run(task, finished, actor={"optim": {"lr": 0.5}})
    with pytest.raises(RecipeError) as error:
        run_recipe(changed, get_plugin_manager())
    assert str(error.value) == (
        f"trainer.default_local_dir: {finished} holds a checkpoint (global_step_2) of a run with "
        "another recipe: actor.optim.lr 0.01 -> 0.5; give this run a folder of its own "
        f"(trainer.default_local_dir={finished.with_name('run-2')}), start afresh there "
        "(trainer.resume_mode=disable), or continue that run with this recipe "
        f"(trainer.resume_mode={finished / 'global_step_2'})"
    )
    assert folder_state(finished) == before


def test_the_same_recipe_resumes(task, finished, caplog):
    before = folder_state(finished)
    with caplog.at_level(logging.INFO, logger="plugrl.run"):
        run_recipe(sim_run(task, finished), get_plugin_manager())
    assert f"resumed from {finished / 'global_step_2'} (step 2)" in caplog.messages
    assert logged_steps(finished) == [1, 2]
    assert folder_state(finished)["recipe.yaml"] == before["recipe.yaml"]
    assert not (finished / "recipe.2.yaml").exists()


def test_keys_that_leave_the_experiment_as_it_was_resume(task, finished, caplog):
    longer = sim_run(
        task,
        finished,
        steps=3,
        trainer={"logger": ["jsonl", "console"], "test_freq": 5, "max_ckpt_to_keep": 1},
        actor={"ppo_micro_batch_size_per_gpu": 2},
    )
    with caplog.at_level(logging.INFO, logger="plugrl.run"):
        run_recipe(longer, get_plugin_manager())
    assert f"resumed from {finished / 'global_step_2'} (step 2)" in caplog.messages
    assert logged_steps(finished) == [1, 2, 3]
    assert (finished / "recipe.2.yaml").read_text() == longer.to_yaml()
    assert not any("not one experiment" in message for message in caplog.messages)


def test_starting_afresh_or_continuing_by_path_is_not_stopped(task, finished, caplog):
    afresh = sim_run(
        task, finished, actor={"optim": {"lr": 0.5}}, trainer={"resume_mode": "disable"}
    )
    run_recipe(afresh, get_plugin_manager())
    assert logged_steps(finished) == [1, 2]  # trained again from the start
    checkpoint = str(finished / "global_step_2")
    by_path = sim_run(
        task,
        finished,
        steps=3,
        actor={"optim": {"lr": 0.5}},
        data={"seed": 7},
        trainer={"resume_mode": checkpoint},
    )
    with caplog.at_level(logging.INFO, logger="plugrl.run"):
        run_recipe(by_path, get_plugin_manager())
    assert f"resumed from {checkpoint} (step 2)" in caplog.messages
    assert logged_steps(finished) == [1, 2, 3]
    assert (
        f"this run continues {finished} with a recipe that differs in data.seed 1 -> 7: the steps "
        "before and after are not one experiment"
    ) in caplog.messages


def test_a_folder_recorded_before_an_option_existed_resumes_while_it_keeps_its_default(
    task, finished, caplog
):
    """A run folder of an older plugrl lacks the options added since: at their defaults they
    are the run as it was; set otherwise, they change it."""
    recorded = yaml.safe_load((finished / "recipe.yaml").read_text())
    del recorded["reward"]["overlap"]
    del recorded["trainer"]["rollout_data_dir"]
    (finished / "recipe.yaml").write_text(yaml.safe_dump(recorded))
    newer = sim_run(task, finished, steps=3, reward={"overlap": True})
    with caplog.at_level(logging.INFO, logger="plugrl"):
        run_recipe(newer, get_plugin_manager())
    assert logged_steps(finished) == [1, 2, 3]
    # nor is the segment warned about as another experiment
    assert not [m for m in caplog.messages if "not one experiment" in m], caplog.messages

    del recorded["actor"]["optim"]["lr"]  # recorded without it, and set otherwise now
    (finished / "recipe.yaml").write_text(yaml.safe_dump(recorded))
    for extra in finished.glob("recipe.*.yaml"):
        extra.unlink()
    with pytest.raises(RecipeError, match=r"another recipe: actor\.optim\.lr \(unset\) -> 0\.5"):
        check_resume(sim_run(task, finished, steps=4, actor={"optim": {"lr": 0.5}}), finished)


def test_a_folder_that_recorded_relative_paths_resumes_from_where_they_lead(
    task, finished, monkeypatch
):
    """plugrl once recorded paths as written; it records them resolved now. The folder of such
    a run resumes when the relative paths lead to the files the run names now, from the
    working folder, and only then."""
    recipe = sim_run(task, finished, steps=3)
    assert Path(recipe.model.tokenizer_path).is_absolute()
    assert yaml.safe_load((finished / "recipe.yaml").read_text())["data"]["train_files"] == [
        str(task.train_file)
    ]
    recorded = yaml.safe_load((finished / "recipe.yaml").read_text())
    base = task.train_file.parent
    recorded["model"]["tokenizer_path"] = os.path.relpath(task.tokenizer, base)
    recorded["data"]["train_files"] = [task.train_file.name]
    recorded["data"]["val_files"] = [f"./{task.val_file.name}"]
    (finished / "recipe.yaml").write_text(yaml.safe_dump(recorded))
    monkeypatch.chdir(base)
    check_resume(recipe, finished, get_plugin_manager())
    monkeypatch.chdir(finished)
    with pytest.raises(RecipeError, match=r"another recipe: model\.tokenizer_path "):
        check_resume(recipe, finished, get_plugin_manager())


def test_a_folder_without_a_checkpoint_or_without_a_recorded_recipe_is_not_checked(tmp_path):
    recipe = build_recipe({"trainer": {"default_local_dir": str(tmp_path)}}, get_plugin_manager())
    check_resume(recipe, tmp_path)  # empty folder
    (tmp_path / "recipe.yaml").write_text(
        build_recipe({"rollout": {"n": 3}}, get_plugin_manager()).to_yaml()
    )
    check_resume(recipe, tmp_path)  # a recipe, no checkpoint
    (tmp_path / "recipe.yaml").unlink()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4\n")
    (tmp_path / "global_step_4").mkdir()
    check_resume(recipe, tmp_path)  # a checkpoint of a run that recorded no recipe


def test_changes_are_keys_with_old_and_new_values_a_few_at_most():
    before = build_recipe({}, get_plugin_manager()).to_dict()
    after = build_recipe(
        {
            "rollout": {"n": 4, "temperature": 0.7},
            "data": {"train_files": ["/d/a.parquet"], "max_response_length": 64},
            "trainer": {"total_training_steps": 90, "logger": ["jsonl"], "seed": 3},
        },
        get_plugin_manager(),
    ).to_dict()
    changed = recipe_changes(before, after)
    assert changed == [
        "data.train_files",
        "data.max_response_length",
        "rollout.n",
        "rollout.temperature",
        "trainer.seed",
    ]
    assert describe_changes(before, after, changed) == (
        "data.train_files [] -> [/d/a.parquet], data.max_response_length 512 -> 64, "
        "rollout.n 1 -> 4 and 2 more"
    )


def test_paths_are_compared_as_the_folders_they_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = build_recipe({"model": {"path": "models/m"}}, get_plugin_manager()).to_dict()
    absolute = build_recipe(
        {"model": {"path": str(tmp_path / "models" / "m")}}, get_plugin_manager()
    ).to_dict()
    assert recipe_changes(relative, absolute) == []
    assert recipe_changes(
        relative, build_recipe({"model": {"path": "other"}}, get_plugin_manager()).to_dict()
    ) == ["model.path"]


def test_every_key_let_through_is_a_recipe_key_with_its_reason():
    recipe_keys = set(_flat_keys(build_recipe({}, get_plugin_manager()).to_dict()))
    # keys of one plugin's section: the fsdp2 backend's and the fully-async scheduler's
    plugin_keys = {
        "actor.param_offload",
        "actor.reshard_after_forward",
        "actor.use_remove_padding",
        "scheduler.total_rollout_steps",
    }
    for key, reason in NOT_EXPERIMENT_KEYS.items():
        # a key, or a section whose every key is let through (trainer.health)
        is_section = any(recipe_key.startswith(f"{key}.") for recipe_key in recipe_keys)
        assert key in recipe_keys or key in plugin_keys or is_section, key
        assert reason


def _flat_keys(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _flat_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_a_mapping_given_keys_is_named_by_its_keys_once():
    before = build_recipe({}, get_plugin_manager()).to_dict()
    after = build_recipe(
        {"model": {"override_config": {"rope_theta": 500000.0}}}, get_plugin_manager()
    ).to_dict()
    changed = recipe_changes(before, after)
    assert changed == ["model.override_config.rope_theta"]
    assert describe_changes(before, after, changed) == (
        "model.override_config.rope_theta (unset) -> 500000.0"
    )
    assert recipe_changes(after, before) == ["model.override_config.rope_theta"]


def test_the_folder_suggested_for_another_experiment_is_a_new_one(tmp_path, monkeypatch):
    from plugrl.run.folder import _another_folder

    (tmp_path / "run").mkdir()
    (tmp_path / "run-2").mkdir()
    assert _another_folder(tmp_path / "run") == tmp_path / "run-3"
    monkeypatch.chdir(tmp_path / "run")
    assert _another_folder(Path(".")) == tmp_path / "run-3"


def broken_data_run(task, run_dir, tmp_path):
    """A run that fails at start-up: its training file is not parquet."""
    broken = tmp_path / "broken.parquet"
    broken.write_text("not parquet")
    return sim_run(task, run_dir, data={"train_files": str(broken)})


def test_a_run_that_fails_at_start_up_leaves_no_folder_it_made(task, tmp_path):
    run_dir = tmp_path / "runs" / "project" / "broken"
    with pytest.raises(DataError, match=r"cannot read .* as parquet"):
        run_recipe(broken_data_run(task, run_dir, tmp_path), get_plugin_manager())
    assert not (tmp_path / "runs").exists()  # nor the parents it made for it


def test_a_failed_start_keeps_a_folder_that_existed_or_holds_anything(task, tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(DataError, match=r"cannot read .* as parquet"):
        run_recipe(broken_data_run(task, existing, tmp_path), get_plugin_manager())
    assert existing.is_dir() and not any(existing.iterdir())
    # a parent that existed before stays, holding the user's file, though the run made the
    # folder inside it
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"cannot read .* as parquet"):
        run_recipe(
            broken_data_run(task, tmp_path / "project" / "run", tmp_path), get_plugin_manager()
        )
    assert sorted(p.name for p in (tmp_path / "project").iterdir()) == ["notes.txt"]


def test_only_empty_folders_are_removed_deepest_first(tmp_path):
    from plugrl.run.folder import missing_folders, remove_empty_folders

    run_dir = tmp_path / "a" / "b" / "c"
    made = missing_folders(run_dir)
    assert made == [run_dir, tmp_path / "a" / "b", tmp_path / "a"]
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")  # something the run wrote before failing
    remove_empty_folders(made)
    assert (run_dir / "metrics.jsonl").read_text() == "{}\n"
    (run_dir / "metrics.jsonl").unlink()
    remove_empty_folders(made)
    assert not (tmp_path / "a").exists() and tmp_path.is_dir()
