"""A batch with videos (and an image) through the fsdp2 backend: the rows' video inputs and the
model's M-RoPE positions reach its forward, padded and packed, and give the unsharded model's
log-probs (which it computes with its own positions from the video grids) within 1e-5."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from plugrl.data.batch import Batch, left_pad
from plugrl.data.dataset import PromptDataset, load_tokenizer
from plugrl.data.multimodal import MULTIMODAL_COLUMN, load_multimodal, model_inputs
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import DataConfig, ModelConfig
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_recipe
from tests.plugins.models.qwen2_vl.images import png_bytes
from tests.plugins.models.qwen2_vl.videos import frame_list

TOLERANCE = {"atol": 1e-5, "rtol": 0}
RESPONSE_WIDTH = 4


def prompt(content, videos, images=()):
    return {
        "data_source": "clips",
        "prompt": [{"role": "user", "content": content}],
        "images": list(images),
        "videos": [{"video": frames, "fps": fps} for frames, fps in videos],
        "reward_model": {"ground_truth": "1"},
    }


def video_batch(model_dir, folder) -> Batch:
    """Rows with a video, an image and a video, two videos, and none (read from a parquet
    file written in ``folder``); random responses."""
    path = folder / "train.parquet"
    rows = [
        prompt("<video>What moves?", [(frame_list(4), 4.0)]),
        prompt("<image> then <video>", [(frame_list(3, (84, 56)), 2.0)], [png_bytes((9, 9, 9))]),
        prompt("<video> or <video>?", [(frame_list(2), 1.0), (frame_list(6), 3.0)]),
        prompt("No video: say hello.", []),
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    model = ModelConfig(path=str(model_dir))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    config = DataConfig(train_files=[str(path)], train_batch_size=4, max_prompt_length=128)
    records = PromptDataset.train(config, tokenizer, multimodal).records
    generator = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = left_pad([r.prompt_ids for r in records], tokenizer.pad_token_id)
    lengths = torch.randint(1, RESPONSE_WIDTH + 1, (len(records),), generator=generator)
    responses = torch.randint(1, 381, (len(records), RESPONSE_WIDTH), generator=generator)
    response_mask = (torch.arange(RESPONSE_WIDTH)[None, :] < lengths[:, None]).long()
    responses = torch.where(response_mask.bool(), responses, tokenizer.pad_token_id)
    inputs = [r.multi_modal_inputs for r in records]
    out = Batch(
        {
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "responses": responses,
            "response_mask": response_mask,
        },
        {MULTIMODAL_COLUMN: inputs},
    )
    out["position_ids"] = multimodal.family.position_ids(
        out["input_ids"], out["attention_mask"], inputs
    )
    return out


@pytest.fixture(scope="module")
def batch(tiny_vl_model, tmp_path_factory):
    return video_batch(tiny_vl_model, tmp_path_factory.mktemp("videos"))


def reference_log_probs(model_dir, batch: Batch) -> torch.Tensor:
    """The unsharded model's log-probs, its positions computed by itself from the token types,
    the grids and the seconds per temporal patch."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    config = model.config
    ids = batch["input_ids"]
    types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=batch["attention_mask"],
            mm_token_type_ids=types,
            **model_inputs(list(batch[MULTIMODAL_COLUMN])),
        ).logits
    log_softmax = torch.log_softmax(logits[:, -RESPONSE_WIDTH - 1 : -1].float(), dim=-1)
    log_probs = log_softmax.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return log_probs * batch["response_mask"]


def test_video_log_probs_are_the_models_own_padded_and_packed(tiny_vl_model, batch):
    expected = reference_log_probs(tiny_vl_model, batch)
    results = {}
    for packed in (False, True):
        recipe = make_recipe(
            tiny_vl_model,
            ppo_mini_batch_size=4,
            use_remove_padding=packed,
            ppo_micro_batch_size_per_gpu=2,
        )
        backend = make_backend(recipe)
        results[packed] = backend.compute_log_prob(batch)["log_probs"]
        torch.testing.assert_close(results[packed], expected, **TOLERANCE, msg=f"packed {packed}")
    # the frames matter: other pixels give other log-probs
    other = batch.copy()
    other[MULTIMODAL_COLUMN] = [
        None if row is None else {**row, "pixel_values_videos": row["pixel_values_videos"].flip(0)}
        for row in batch[MULTIMODAL_COLUMN]
    ]
    changed = backend.compute_log_prob(other)["log_probs"]
    mask = batch["response_mask"].bool()
    assert (changed[0][mask[0]] - results[True][0][mask[0]]).abs().max() > 1e-3
