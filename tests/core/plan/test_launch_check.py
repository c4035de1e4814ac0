"""trainer.memory_check: the estimate at launch, before any model loads."""

from __future__ import annotations

import json
import logging

import pytest

from plugrl.errors import RecipeError
from plugrl.plan.planner import check_memory_at_launch
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import load_recipe


class _Accelerator:
    """A device class that reports 1 GiB, as an accelerator's plugin would."""

    def total_memory(self) -> int:
        return 1024**3


def test_off_on_cpu_unless_asked(bench_recipe):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, [], plugins)
    assert recipe.trainer.memory_check == "warn"
    assert check_memory_at_launch(recipe, plugins, _Accelerator, "cpu") is None


def test_on_by_default_on_an_accelerator(bench_recipe, caplog):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, [], plugins)
    with caplog.at_level(logging.WARNING, logger="plugrl.plan"):
        line = check_memory_at_launch(recipe, plugins, _Accelerator, "cuda")
    assert line is not None and line in caplog.text
    assert line.startswith("memory check: the update phase needs ")
    assert "GiB on each trainer device, 1.0 GiB there (" in line
    assert "largest term: actor activations (10.9 GiB)" in line
    assert line.endswith("plugrl plan RECIPE [KEY=VALUE ...] --device-memory 1GiB")


def test_error_stops_and_off_skips(bench_recipe):
    plugins = get_plugin_manager()
    asked = ["trainer.memory_check=error", "trainer.device_memory_gib=4"]
    recipe = load_recipe(bench_recipe, asked, plugins)
    with pytest.raises(RecipeError) as error:
        check_memory_at_launch(recipe, plugins, _Accelerator, "cpu")
    assert str(error.value).startswith("trainer.memory_check: memory check: the update phase")
    assert "\n" not in str(error.value)
    off = load_recipe(bench_recipe, ["trainer.memory_check=off"], plugins)
    assert check_memory_at_launch(off, plugins, _Accelerator, "cuda") is None


def test_run_stops_before_loading_the_model(bench_recipe, tmp_path):
    """On cpu with the key set, run_recipe fails in the check: the folder holds only a
    config.json and a tokenizer config, so a run that got as far as loading would fail
    differently."""
    from plugrl.run.runner import run_recipe

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 896,
                "num_hidden_layers": 24,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "intermediate_size": 4864,
                "vocab_size": 151936,
                "tie_word_embeddings": True,
            }
        )
    )
    (model / "tokenizer_config.json").write_text("{}")
    plugins = get_plugin_manager()
    recipe = load_recipe(
        bench_recipe,
        [
            f"model.path={model}",
            "trainer.memory_check=error",
            "trainer.device_memory_gib=8",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        plugins,
    )
    with pytest.raises(RecipeError, match=r"memory check: the update phase needs 27\.2 GiB"):
        run_recipe(recipe, plugins)
    assert not (tmp_path / "run").exists()
