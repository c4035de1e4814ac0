"""Videos in verl's layout (``data.video_key``, ``<video>``) read for the tiny vision-language
model: frame lists and video files decoded and sampled once per row, processed by the PIL
video processor into the model's video inputs, carried with the batch, placed by the model's
own M-RoPE positions, and every bad video stopped with one line naming the row, the column and
the fix."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from plugrl.data.batch import VIDEOS_COLUMN
from plugrl.data.dataset import PromptDataset, PromptLoader, load_tokenizer
from plugrl.data.multimodal import MULTIMODAL_COLUMN, model_inputs
from plugrl.data.video import frames_of
from plugrl.errors import DataError
from plugrl.recipe import DataConfig, ModelConfig
from tests.plugins.models.qwen2_vl.images import png_bytes
from tests.plugins.models.qwen2_vl.rows import dataset
from tests.plugins.models.qwen2_vl.videos import frame_list, mp4_bytes


def row(content: str, videos, images=(), answer: str = "1") -> dict:
    return {
        "data_source": "clips",
        "prompt": [{"role": "user", "content": content}],
        "images": list(images),
        "videos": videos,
        "reward_model": {"ground_truth": answer},
    }


def structs(frames: list[bytes]) -> list[dict]:
    return [{"bytes": frame, "path": None} for frame in frames]


def tokens_of(ids, token_id) -> int:
    return sum(1 for token in ids if token == token_id)


def test_frame_lists_are_processed_once_and_travel_with_the_batch(tmp_path, vision):
    tokenizer, multimodal = vision
    config = multimodal.family.hf_config
    (tmp_path / "f0.png").write_bytes(frame_list(1)[0])
    rows = [
        # four frames of 56 x 56 at 4 a second: two temporal patches of 2 x 2 merged patches
        row("<video>What moves?", [{"video": structs(frame_list(4)), "fps": 4.0}]),
        # an image, then three frames (padded to four), the first a path
        row(
            "<image> then <video>",
            [{"video": [{"bytes": None, "path": "f0.png"}, *structs(frame_list(3)[1:])]}],
            [png_bytes((255, 0, 0))],
        ),
        row("No video.", [], answer="0"),
    ]
    data, data_config = dataset(tmp_path, rows, vision)
    first, second, third = data.records
    assert tokens_of(first.prompt_ids, config.video_token_id) == 8
    assert tokens_of(second.prompt_ids, config.video_token_id) == 8
    assert tokens_of(second.prompt_ids, config.image_token_id) == 4
    assert first.multi_modal_inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert first.multi_modal_inputs["pixel_values_videos"].shape == (32, 3 * 2 * 14 * 14)
    # seconds per temporal patch: 2 frames at the row's rate (4 a second; the default 2)
    assert first.multi_modal_inputs["second_per_grid_ts"].tolist() == [0.5]
    assert second.multi_modal_inputs["second_per_grid_ts"].tolist() == [1.0]
    assert set(second.multi_modal_inputs) == {
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "second_per_grid_ts",
    }
    assert third.multi_modal_inputs is None and third.videos == ()
    # the sampled frames travel for the engines that run the processor themselves
    assert [video["fps"] for video in first.videos] == [4.0]
    assert frames_of(first.videos[0]).shape == (4, 56, 56, 3)

    loader = PromptLoader.for_training(data, data_config, tokenizer.pad_token_id)
    batch = pickle.loads(pickle.dumps(loader.next_batch()))  # as Ray moves it
    assert len(batch[VIDEOS_COLUMN]) == 3
    joined = model_inputs(list(batch[MULTIMODAL_COLUMN]))
    assert joined["video_grid_thw"].shape == (2, 3)
    assert joined["image_grid_thw"].shape == (1, 3)
    assert joined["second_per_grid_ts"].shape == (2,)
    assert joined["pixel_values_videos"].shape[0] == int(joined["video_grid_thw"].prod(-1).sum())


def test_a_video_of_one_frame_twice_is_that_frame_as_an_image(vision):
    """The PIL video processor lays out patches as transformers' image processor does for a
    still image (which repeats the image over a temporal patch)."""
    import numpy as np
    from PIL import Image

    _, multimodal = vision
    image = Image.open(io.BytesIO(png_bytes((10, 200, 30), (84, 56)))).convert("RGB")
    video = np.stack([np.asarray(image)] * 2)
    as_image = multimodal.processor.image_processor(images=[image], return_tensors="pt")
    as_video = multimodal.processor.video_processor([video], return_tensors="pt")
    torch.testing.assert_close(as_video["pixel_values_videos"], as_image["pixel_values"])
    assert as_video["video_grid_thw"].tolist() == as_image["image_grid_thw"].tolist()


def test_a_video_file_is_decoded_and_sampled(tmp_path, vision):
    _, multimodal = vision
    config = multimodal.family.hf_config
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(mp4_bytes(16, fps=8))  # two seconds
    rows = [
        row("<video>?", [{"video": "clip.mp4", "fps": 2.0, "nframes": None}]),  # 4 frames
        row("<video>?", [{"video": "clip.mp4", "fps": None, "nframes": 6}]),
        row("<video>?", [{"video": "clip.mp4", "fps": 1.0, "nframes": None}]),  # min_frames 4
    ]
    data, _ = dataset(tmp_path, rows, vision)
    frames = [len(record.videos[0]["frames"]) for record in data.records]
    assert frames == [4, 6, 4]
    rates = [record.videos[0]["fps"] for record in data.records]
    assert rates == [2.0, 3.0, 2.0]
    assert [tokens_of(r.prompt_ids, config.video_token_id) for r in data.records] == [8, 12, 8]
    # a file's bytes, as a parquet struct, read the same
    as_struct = row("<video>?", [{"bytes": clip.read_bytes(), "path": None}])
    raw, _ = dataset(tmp_path, [as_struct], vision)
    assert raw.records[0].videos[0]["frames"] == data.records[0].videos[0]["frames"]


def test_positions_are_the_models_own_with_videos(tmp_path, vision):
    """The family's positions equal the model's ``get_rope_index`` fed as the processor feeds
    it, and a video's frames step its temporal positions by tokens_per_second x seconds."""
    from transformers import AutoModel

    _, multimodal = vision
    family = multimodal.family
    config = family.hf_config
    data, _ = dataset(
        tmp_path,
        [
            row(
                "<image> and <video> and <video>",
                [{"video": frame_list(4), "fps": 4.0}] * 2,
                [png_bytes((0, 0, 255))],
            )
        ],
        vision,
    )
    record = data.records[0]
    ids = torch.tensor([list(record.prompt_ids)])
    mask = torch.ones_like(ids)
    mine = family.position_ids(ids, mask, [record.multi_modal_inputs])
    inputs = record.multi_modal_inputs
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    token_types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
    theirs, _ = model.get_rope_index(
        ids,
        mm_token_type_ids=token_types,
        image_grid_thw=inputs["image_grid_thw"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=mask,
    )
    assert torch.equal(mine, theirs.permute(1, 0, 2))
    video = (ids[0] == config.video_token_id).nonzero().flatten()
    temporal = mine[0, 0, video[:8]].tolist()
    step = int(config.vision_config.tokens_per_second * 0.5)
    assert temporal[4] - temporal[0] == step and step > 0
    # a sampled video token beyond the row's videos is refused
    extra = torch.cat([ids, torch.tensor([[config.video_token_id]])], dim=1)
    with pytest.raises(ValueError, match=r"row 0 holds 17 video tokens but its videos expand"):
        family.position_ids(extra, torch.ones_like(extra), [inputs])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            row("<video><video> two?", [frame_list(2)]),
            r"row 0: 2 <video> placeholders in column 'prompt' but 1 videos in column 'videos'; "
            r"put one <video>",
        ),
        (row("none?", [frame_list(2)]), r"row 0: 0 <video> placeholders .* but 1 videos"),
        (
            row("<video>?", [b"not a video"]),
            r"row 0: video 0 of column 'videos' \(11 bytes\) cannot be decoded as a video",
        ),
        (
            row("<video>?", [[b"not a frame"]]),
            r"row 0: video 0 of column 'videos', frame 0 \(11 bytes\) cannot be decoded",
        ),
        (
            row("<video>?", [frame_list(1) + frame_list(1, (84, 56))]),
            r"row 0: video 0 of column 'videos' has frames of 2 sizes",
        ),
        (
            row("<video>?", [{"video": frame_list(2), "fps": -1.0}]),
            r"row 0: video 0 of column 'videos': fps=-1.0; set it to a number above 0",
        ),
        (
            row("<video>?", [{"video": "clip.mp4", "fps": 2.0, "nframes": 4}]),
            r"row 0: video 0 of column 'videos' sets both nframes=4 and fps=2",
        ),
        (
            row("<video>?", [{"video": "clip.mp4", "min_frames": 8, "max_frames": 4}]),
            r"min_frames=8 is above max_frames=4; set min_frames <= max_frames",
        ),
        (
            row("<video>?", [{"video": "clip.mp4", "nframes": 99}]),
            r"nframes=99 but the video has 8 frames; lower nframes",
        ),
        (
            row("<video>?", [{"video": frame_list(2), "nframes": 2}]),
            r"is a list of frames with nframes set, which only sample a video file",
        ),
        (
            row("<video>?", [{"video": frame_list(2), "max_pixels": 100}]),
            r"sets max_pixels, which plugrl does not read; a video takes fps, nframes",
        ),
        (row("<video>?", ["missing.mp4"]), r"is the path missing.mp4, which is not a file"),
        (
            row("<video>?", [{"bytes": None, "path": ""}]),
            r"row 0: video 0 of column 'videos' has neither bytes nor a path; store a list of "
            r"frames",
        ),
    ],
)
def test_a_bad_video_is_one_line_naming_the_row_and_the_column(tmp_path, vision, bad, message):
    (tmp_path / "clip.mp4").write_bytes(mp4_bytes(8))
    with pytest.raises(DataError, match=message) as caught:
        dataset(tmp_path, [bad], vision)
    assert "\n" not in str(caught.value)
    assert "train.parquet row 0" in str(caught.value)


def test_a_video_too_long_for_the_prompt_is_refused_or_filtered(tmp_path, vision):
    rows = [row("<video>What happens?", [frame_list(8)]), row("short", [], answer="0")]
    with pytest.raises(
        DataError,
        match=r"row 0: prompt is \d+ tokens with the 1 videos of column 'videos' expanded "
        r"\(18 vision tokens\), over data.max_prompt_length=24; raise data.max_prompt_length, "
        r"use smaller or fewer-frame videos",
    ):
        dataset(tmp_path, rows, vision, max_prompt_length=24)
    kept, _ = dataset(tmp_path, rows, vision, max_prompt_length=24, filter_overlong_prompts=True)
    assert [r.multi_modal_inputs for r in kept.records] == [None]


def test_the_video_column_is_named_by_data_video_key(tmp_path, vision, tiny_task):
    rows = [row("<video>?", [frame_list(2)])]
    rows[0]["clips"] = rows[0].pop("videos")
    data, _ = dataset(tmp_path, rows, vision, video_key="clips")
    assert data.records[0].multi_modal_inputs is not None
    # a text model refuses them
    model = ModelConfig(path=str(tiny_task.model))
    path = tmp_path / "train.parquet"
    config = DataConfig(train_files=[str(path)], train_batch_size=1, video_key="clips")
    with pytest.raises(DataError, match=r"row 0: column 'clips' holds videos, but model.path"):
        PromptDataset.train(config, load_tokenizer(model))


def test_a_video_file_without_pyav_and_an_empty_video_are_one_line(tmp_path, vision, monkeypatch):
    (tmp_path / "clip.mp4").write_bytes(mp4_bytes(4))
    monkeypatch.setitem(__import__("sys").modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(
        DataError,
        match=r"row 0: video 0 of column 'videos' is a video file \(.*clip.mp4\), and decoding "
        r"one needs PyAV; install it \(pip install 'plugrl\[video\]'\) or store the video as a "
        r"list of frames",
    ):
        dataset(tmp_path, [row("<video>?", ["clip.mp4"])], vision)
    with pytest.raises(DataError, match=r"row 0: video 0 of column 'videos' is an empty list"):
        dataset(tmp_path, [row("<video>?", [{"video": [], "fps": 2.0}])], vision)
