"""GRPO steps on a vision-language batch through the real run loop: rows with images (and one
with a video) read in verl's layout, the hf engine sampling from them, the model's M-RoPE
positions on the batch, and the fsdp2 actor (packed) updating the whole model, vision tower
included."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plugrl
from plugrl.errors import RecipeError
from plugrl.parts.rollout import Capability
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.runner import run_recipe
from plugrl_hf.engine import HFRolloutEngine
from tests.plugins.models.qwen2_vl.images import png_bytes
from tests.plugins.models.qwen2_vl.videos import frame_list

pytestmark = pytest.mark.slow

REWARD = """
import hashlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    digest = hashlib.sha256(solution_str.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
"""


def rows() -> list[dict]:
    colours = [(255, 0, 0), (0, 200, 0), (0, 0, 255), (200, 200, 0)]
    out = []
    for index, colour in enumerate(colours):
        images = [{"bytes": png_bytes(colour, (56 + 28 * (index % 2), 56)), "path": None}]
        content = "<image>How many squares?"
        videos = []
        if index == 3:
            images.append({"bytes": png_bytes(colour[::-1]), "path": None})
            content = "<image> or <image>: which is brighter?"
        if index == 1:
            # a video after the image: 4 frames, 8 tokens
            frames = [{"bytes": frame, "path": None} for frame in frame_list(4)]
            videos.append({"video": frames, "fps": 2.0})
            content = "<image> then <video>: how many squares?"
        out.append(
            {
                "data_source": "shapes",
                "prompt": [{"role": "user", "content": content}],
                "images": images,
                "videos": videos,
                "reward_model": {"ground_truth": "1"},
            }
        )
    return out


class TextOnlyEngine(HFRolloutEngine):
    """The hf engine without Capability.IMAGES, as an engine that cannot take images is."""

    capabilities = HFRolloutEngine.capabilities - {Capability.IMAGES}


class TextOnlyEngines:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        register(
            "hf-text-only",
            "tests.e2e.test_vision_run:TextOnlyEngine",
            config="plugrl_hf.config:HFRolloutConfig",
            description="the hf engine without images (tests)",
        )


def vision_recipe(model, tmp_path) -> dict:
    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows()), train)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD, encoding="utf-8")
    run_dir = tmp_path / "run"
    return {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {
            "train_files": [str(train)],
            "train_batch_size": 4,
            "max_prompt_length": 64,
            "max_response_length": 6,
        },
        "reward": {"custom_function": {"path": str(reward)}},
        "device": "cpu",
        "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}, "use_remove_padding": True},
        "rollout": {"n": 2, "engine": "hf", "dtype": "float32"},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "total_training_steps": 2,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "seed": 7,
        },
    }


def test_grpo_steps_train_a_vision_language_model(tiny_vl_model, tmp_path):
    recipe = vision_recipe(tiny_vl_model, tmp_path)
    plugins = get_plugin_manager()
    run_recipe(build_recipe(recipe, plugins), plugins)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = {record["step"]: record for record in map(json.loads, lines)}
    assert set(steps) >= {1, 2}
    for step in (1, 2):
        metrics = steps[step]
        # the engine sampled from the images and the video with the weights the trainer has
        assert metrics["training/rollout_probs_diff_mean"] < 1e-5, metrics
        assert metrics["actor/grad_norm"] > 0


def test_an_engine_without_images_is_refused_at_start_up(
    tiny_vl_model, tmp_path, plugrl_register_plugin
):
    plugrl_register_plugin(TextOnlyEngines(), "text-only-engines")
    recipe = vision_recipe(tiny_vl_model, tmp_path)
    recipe["rollout"]["engine"] = "hf-text-only"
    plugins = get_plugin_manager()
    with pytest.raises(RecipeError) as error:
        run_recipe(build_recipe(recipe, plugins), plugins)
    assert str(error.value).startswith(
        "rollout.engine: rollout engine 'hf-text-only' cannot generate from prompts with "
        "images, which data with images needs"
    )
