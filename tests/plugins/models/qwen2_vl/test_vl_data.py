"""Rows in verl's multimodal layout read for the tiny vision-language model: images decoded and
processed once per row, their inputs carried in the batch (through pickling, as Ray moves
them), and every bad row stopped with one line naming the row, the column and the fix."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from plugrl.data.batch import IMAGES_COLUMN
from plugrl.data.dataset import PromptDataset, PromptLoader, load_tokenizer
from plugrl.data.multimodal import MULTIMODAL_COLUMN, load_multimodal, model_inputs
from plugrl.errors import DataError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import DataConfig, ModelConfig
from tests.plugins.models.qwen2_vl.images import png_bytes
from tests.plugins.models.qwen2_vl.rows import dataset

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def row(content: str, images, answer: str = "1") -> dict:
    return {
        "data_source": "shapes",
        "prompt": [{"role": "user", "content": content}],
        "images": images,
        "reward_model": {"ground_truth": answer},
    }


def good_rows(tmp_path):
    picture = tmp_path / "blue.png"
    picture.write_bytes(png_bytes(BLUE))
    return [
        row("<image>How many squares?", [{"bytes": png_bytes(RED), "path": None}]),
        row(
            "Compare <image> with <image>.",
            [
                {"bytes": png_bytes(GREEN, (112, 56)), "path": None},
                {"bytes": None, "path": "blue.png"},
            ],
            "2",
        ),
        row("No picture here.", [], "0"),
    ]


def test_rows_are_processed_once_and_their_inputs_travel_with_the_batch(tmp_path, vision):
    data, config = dataset(tmp_path, good_rows(tmp_path), vision)
    tokenizer, multimodal = vision
    image_id = multimodal.family.hf_config.image_token_id
    first, second, text_only = data.records
    assert first.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert second.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 4, 8], [1, 4, 4]]
    assert first.prompt_ids.count(image_id) == 4
    assert second.prompt_ids.count(image_id) == 8 + 4
    assert text_only.multi_modal_inputs is None
    assert image_id not in text_only.prompt_ids
    # the image file given by a path relative to the parquet file reads as the bytes do
    same = multimodal.processor.image_processor(
        [__import__("PIL.Image").Image.open(tmp_path / "blue.png").convert("RGB")],
        return_tensors="pt",
    )["pixel_values"]
    torch.testing.assert_close(second.multi_modal_inputs["pixel_values"][32:], same)
    # the encoded images engines decode themselves: the row's bytes, the file's for a path
    assert first.images == (png_bytes(RED),)
    assert second.images == (png_bytes(GREEN, (112, 56)), png_bytes(BLUE))
    assert text_only.images == ()

    loader = PromptLoader.for_training(data, config, tokenizer.pad_token_id)
    batch = loader.next_batch()
    assert MULTIMODAL_COLUMN in batch
    moved = pickle.loads(pickle.dumps(batch.repeat(2)))
    by_index = {
        int(i): inputs for i, inputs in zip(moved["index"], moved[MULTIMODAL_COLUMN], strict=True)
    }
    assert by_index[2] is None
    images_by_index = dict(zip(moved["index"], moved[IMAGES_COLUMN], strict=True))
    assert images_by_index[1] == second.images
    assert images_by_index[2] == ()
    torch.testing.assert_close(
        by_index[1]["pixel_values"], second.multi_modal_inputs["pixel_values"]
    )
    joined = model_inputs(list(moved[MULTIMODAL_COLUMN]))
    assert joined["image_grid_thw"].shape == (2 * 3, 3)
    assert joined["pixel_values"].shape[0] == int(joined["image_grid_thw"].prod(-1).sum())
    assert model_inputs([None, None]) == {}


def test_a_text_model_refuses_rows_with_images(tmp_path, tiny_task):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([row("<image>?", [png_bytes(RED)])]), path)
    model = ModelConfig(path=str(tiny_task.model))
    tokenizer = load_tokenizer(model)
    assert load_multimodal(model, tokenizer, get_plugin_manager()) is None
    config = DataConfig(train_files=[str(path)], train_batch_size=1)
    with pytest.raises(DataError, match=r"row 0: column 'images' holds images, but model.path"):
        PromptDataset.train(config, tokenizer)
    # nor does it read videos
    pq.write_table(pa.Table.from_pylist([{**row("?", []), "videos": [b"frames"]}]), path)
    with pytest.raises(DataError, match=r"row 0: column 'videos' holds videos, but model.path"):
        PromptDataset.train(config, tokenizer)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            row("<image><image> two?", [png_bytes(RED)]),
            r"row 0: 2 <image> placeholders in column 'prompt' but 1 images in column 'images'; "
            r"put one <image>",
        ),
        (
            row("none?", [png_bytes(RED)]),
            r"row 0: 0 <image> placeholders in column 'prompt' but 1 images",
        ),
        (
            row("<image>?", [b"not an image"]),
            r"row 0: image 0 of column 'images' \(12 bytes\) cannot be decoded as an image",
        ),
        (
            row("<image>?", ["missing.png"]),
            r"row 0: image 0 of column 'images' is the path missing.png, which is not a file; "
            r"fix the path",
        ),
        (
            row("<image>?", [{"bytes": None, "path": None}]),
            r"row 0: image 0 of column 'images' has neither bytes nor a path",
        ),
    ],
)
def test_a_bad_row_is_one_line_naming_the_row_and_the_column(tmp_path, vision, bad, message):
    with pytest.raises(DataError, match=message) as caught:
        dataset(tmp_path, [bad], vision)
    assert "\n" not in str(caught.value)
    assert "train.parquet row 0" in str(caught.value)


def test_the_image_column_is_named_by_data_image_key(tmp_path, vision):
    rows = [row("<image>?", [png_bytes(RED)])]
    rows[0]["pictures"] = rows[0].pop("images")
    data, _ = dataset(tmp_path, rows, vision, image_key="pictures")
    assert data.records[0].multi_modal_inputs is not None
    with pytest.raises(
        DataError, match=r"1 <image> placeholders .* but 0 images in column 'images'"
    ):
        dataset(tmp_path, rows, vision)


def test_an_image_too_large_for_the_prompt_is_refused_filtered_or_never_cut_through(
    tmp_path, vision
):
    # 112 x 112: 16 image tokens, over a 20-token prompt limit with the chat template
    rows = [
        row("<image>How many squares are in this picture?", [png_bytes(RED, (112, 112))]),
        row("short", [], "0"),
    ]
    with pytest.raises(
        DataError,
        match=r"row 0: prompt is \d+ tokens with the 1 images of column 'images' expanded "
        r"\(18 vision tokens\), over data.max_prompt_length=24; raise data.max_prompt_length, "
        r"use smaller images, or set data.filter_overlong_prompts=true",
    ):
        dataset(tmp_path, rows, vision, max_prompt_length=24)
    with pytest.raises(DataError, match=r"data\.truncation=left would cut through its images"):
        dataset(tmp_path, rows, vision, max_prompt_length=24, truncation="left")
    kept, _ = dataset(tmp_path, rows, vision, max_prompt_length=24, filter_overlong_prompts=True)
    assert [r.multi_modal_inputs for r in kept.records] == [None]
    # a cut that keeps every image token is allowed: the text after the image goes
    cut, _ = dataset(tmp_path, rows[:1], vision, max_prompt_length=26, truncation="right")
    ids = cut.records[0].prompt_ids
    assert len(ids) == 26
    assert ids.count(vision[1].family.hf_config.image_token_id) == 16
