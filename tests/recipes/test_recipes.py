"""The shipped recipes validate here (the hardware ones need accelerators only to run)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import find_recipe, load_recipe, shipped_recipes

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


def test_every_recipe_file_is_shipped():
    assert set(shipped_recipes()) == set(RECIPES)
    assert {"quickstart", "gsm8k-grpo-qwen2.5-0.5b", "dapo-qwen3-8b"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_validates_with_print_config(name):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "plugrl_tools.cli",
            "run",
            str(ROOT / "recipes" / f"{name}.yaml"),
            "--print-config",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["algorithm"]["adv_estimator"] == "grpo"


def test_dapo_recipe_keeps_the_seed_settings():
    recipe = load_recipe(ROOT / "recipes" / "dapo-qwen3-8b.yaml", (), get_plugin_manager())
    assert (recipe.actor.clip_ratio_low, recipe.actor.clip_ratio_high) == (0.2, 0.28)
    assert recipe.algorithm.filter_groups.enable and recipe.data.gen_batch_size == 256
    assert recipe.reward.manager == "dapo" and recipe.reward.overlong_buffer.len == 2048
    # the recipe's relative path, from the folder plugrl runs in
    assert recipe.reward.custom_function.path == os.path.abspath(
        "recipes/rewards/multiple_choice.py"
    )
    assert recipe.actor.param_offload is True


def test_bare_names_find_shipped_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("quickstart") == shipped_recipes()["quickstart"]
    assert (
        load_recipe("quickstart", (), get_plugin_manager()).trainer.experiment_name
        == "grpo-arithmetic"
    )
    (tmp_path / "quickstart").write_text("not used: a bare name that exists is a file")
    assert find_recipe("quickstart") == Path("quickstart")
    with pytest.raises(
        RecipeError,
        match=r"recipe 'nosuch' is neither a file here nor a "
        r"shipped recipe; shipped: .*quickstart",
    ):
        find_recipe("nosuch")


def test_multiple_choice_reward():
    from plugrl_recipes.rewards.multiple_choice import choice_letters, compute_score

    assert [choice_letters(t) for t in ("BD", "D, B", "D and B", "Answer: C")] == [
        "BD",
        "BD",
        "BD",
        "C",
    ]
    assert compute_score("exam", r"so \boxed{B, D}", "BD")["score"] == 1.0
    assert compute_score("exam", r"\boxed{B}", "BD")["score"] == 0.0  # one missing
    assert compute_score("exam", r"\boxed{A} no, \boxed{C}", "C")["acc"] == 1.0  # last box
    assert compute_score("exam", "C", "C")["score"] == 0.0  # no box
