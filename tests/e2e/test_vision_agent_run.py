"""``plugrl run`` of a multi-turn tool loop on the tiny vision-language model: each turn calls a
"zoom" tool whose result carries a crop, and the batch the run trains on holds every image's
tokens (the prompt's, its video's and the crops'), masked out of the loss where a tool put
them, with the model's own M-RoPE positions over the whole sequence; the run finishes with
finite metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

import plugrl
from plugrl.data.batch import MULTIMODAL_COLUMN
from plugrl.data.dataset import load_tokenizer
from plugrl.data.multimodal import load_multimodal
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig
from plugrl_estimators.estimators import GRPO
from plugrl_tools.cli import cli
from tests.e2e.e2e_support import write_recipe
from tests.e2e.test_vision_run import vision_recipe
from tests.plugins.agents.test_vision_agents import VisionAgentPlugin

pytestmark = pytest.mark.slow

SEEN = []
"""The batches the run computed advantages on (the trained batches)."""


class SeeingGRPO(GRPO):
    """GRPO that keeps each batch it is given."""

    def compute(self, batch):
        SEEN.append(batch.copy())
        return super().compute(batch)


class SeeingEstimators:
    @plugrl.hookimpl
    def register_advantage_estimators(self, register):
        register("grpo_seen", f"{__name__}:SeeingGRPO")


def test_a_tool_loop_with_images_runs_end_to_end(tiny_vl_model, tmp_path, plugrl_plugin_manager):
    plugrl_plugin_manager.register(VisionAgentPlugin(), "vision-agent-test")
    plugrl_plugin_manager.register(SeeingEstimators(), "seeing-estimators")
    SEEN.clear()
    recipe = vision_recipe(tiny_vl_model, tmp_path)
    recipe["data"]["max_response_length"] = 64
    recipe["algorithm"]["adv_estimator"] = "grpo_seen"
    recipe["rollout"]["agent"] = {
        "loop": "tool",
        "tools": ["zoom"],
        "tool_parser": "always_zoom",
        "max_turns": 2,
        "max_turn_tokens": 6,
    }
    result = CliRunner().invoke(cli, ["run", str(write_recipe(tmp_path / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.output}{result.exception!r}"

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = {record["step"]: record for record in map(json.loads, lines)}
    assert set(steps) >= {1, 2}
    for step in (1, 2):
        numbers = [v for v in steps[step].values() if isinstance(v, (int, float))]
        assert all(math.isfinite(v) for v in numbers), steps[step]
        assert steps[step]["training/rollout_probs_diff_mean"] < 1e-5

    model = ModelConfig(path=str(tiny_vl_model))
    family = load_multimodal(model, load_tokenizer(model), get_plugin_manager()).family
    config = family.hf_config
    from transformers import AutoModel

    with torch.device("meta"):
        rope = AutoModel.from_config(config)
    merge = config.vision_config.spatial_merge_size**2
    assert len(SEEN) == 2
    crops = 0
    for batch in SEEN:
        width = batch["responses"].shape[1]
        ids, attention = batch["input_ids"], batch["attention_mask"].bool()
        inputs = list(batch[MULTIMODAL_COLUMN])
        for row, row_inputs in enumerate(inputs):
            tokens = ids[row][attention[row]]
            images = int(row_inputs["image_grid_thw"].prod(-1).sum()) // merge
            assert int((tokens == config.image_token_id).sum()) == images
            grids = row_inputs.get("video_grid_thw")
            videos = 0 if grids is None else int(grids.prod(-1).sum()) // merge
            assert int((tokens == config.video_token_id).sum()) == videos
            # the response's image tokens are a tool's crops: attended, never trained
            response = ids[row, -width:]
            crop = response == config.image_token_id
            assert not batch["response_mask"][row][crop].any()
            assert attention[row, -width:][crop].all()
            crops += int(crop.sum())
        # the trained positions are the model's own over the whole sequence
        expected, _ = rope.get_rope_index(
            ids,
            mm_token_type_ids=(ids == config.image_token_id).long()
            + 2 * (ids == config.video_token_id).long(),
            image_grid_thw=torch.cat([x["image_grid_thw"] for x in inputs]),
            video_grid_thw=torch.cat(
                [x["video_grid_thw"] for x in inputs if "video_grid_thw" in x]
            ),
            second_per_grid_ts=torch.cat(
                [x["second_per_grid_ts"] for x in inputs if "second_per_grid_ts" in x]
            ),
            attention_mask=batch["attention_mask"],
        )
        mine = batch["position_ids"].permute(1, 0, 2)
        assert torch.equal(mine[:, attention], expected[:, attention])
    assert crops > 0
