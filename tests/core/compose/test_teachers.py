"""The distillation teachers' start-up refusals and their routing of rows, without starting an
engine: an engine that cannot score, a tokenizer that is not the student's, a row no teacher
takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plugrl.compose.teachers import Teachers, check_same_vocabulary
from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError
from plugrl.testing import make_tiny_tokenizer


@pytest.fixture
def installed(plugrl_plugin_manager):
    """The installed plugins (the real hf engine), and recipes read with them."""
    from plugrl.recipe.build import build_recipe
    from plugrl.recipe.composition import apply_overrides

    def recipe(*overrides: str):
        return build_recipe(apply_overrides({}, overrides), plugrl_plugin_manager)

    return plugrl_plugin_manager, recipe


@pytest.fixture(scope="module")
def student_tokenizer():
    return make_tiny_tokenizer(vocab_size=300)


def test_a_teacher_of_another_vocabulary_is_refused_in_one_line(student_tokenizer):
    other = make_tiny_tokenizer(["a different corpus of words entirely"] * 4, vocab_size=300)
    with pytest.raises(RecipeError, match="another vocabulary than the student") as caught:
        check_same_vocabulary("t", other, student_tokenizer)
    assert caught.value.key == "distillation.teachers.t.model"
    assert "\n" not in str(caught.value)
    check_same_vocabulary("t", student_tokenizer, student_tokenizer)


def test_the_teachers_tokenizer_is_checked_before_its_engine_starts(
    installed, student_tokenizer, tmp_path
):
    plugins, recipe_from = installed
    folder = tmp_path / "teacher"
    make_tiny_tokenizer(["a different corpus of words entirely"] * 4).save_pretrained(folder)
    recipe = recipe_from(
        "distillation.enabled=true", f"distillation.teachers.t.model.path={folder}"
    )
    with pytest.raises(RecipeError, match="another vocabulary") as caught:
        Teachers(recipe, plugins, student_tokenizer)
    assert caught.value.key == "distillation.teachers.t.model"


def test_an_engine_that_cannot_score_is_refused(installed, monkeypatch, tmp_path):
    plugins, recipe_from = installed
    from plugrl.parts.rollout import Capability
    from plugrl_hf.engine import HFRolloutEngine

    monkeypatch.setattr(
        HFRolloutEngine, "capabilities", HFRolloutEngine.capabilities - {Capability.SCORE}
    )
    recipe = recipe_from(
        "distillation.enabled=true", f"distillation.teachers.t.model.path={tmp_path}"
    )
    with pytest.raises(RecipeError, match="cannot score given tokens") as caught:
        Teachers(recipe, plugins, tokenizer=None)
    assert caught.value.key == "distillation.teachers.t.engine"


def routing(recipe) -> Teachers:
    """Teachers that route, with no engines behind them."""
    from plugrl.recipe.teachers import teacher_configs

    teachers = Teachers.__new__(Teachers)
    teachers.config = recipe.distillation
    teachers.teachers = teacher_configs(recipe.distillation)
    teachers.by_key = {t.key: name for name, t in teachers.teachers.items()}
    teachers.groups = {}
    return teachers


def test_rows_go_to_the_teacher_of_their_key(recipe_from):
    recipe = recipe_from(
        "distillation.enabled=true",
        "distillation.teachers.math.model.path=/m/math",
        "distillation.teachers.math.key=gsm8k",
        "distillation.teachers.code.model.path=/m/code",
        "distillation.teachers.code.key=apps",
    )
    teachers = routing(recipe)
    batch = Batch(
        {
            "responses": torch.zeros(3, 2, dtype=torch.long),
            "data_source": np.array(["apps", "gsm8k", "apps"], dtype=object),
        }
    )
    assert teachers.route(batch) == ["code", "math", "code"]
    batch["data_source"] = np.array(["apps", "math500", "apps"], dtype=object)
    with pytest.raises(DataError, match="row 1 has data_source='math500', which no teacher"):
        teachers.route(batch)
