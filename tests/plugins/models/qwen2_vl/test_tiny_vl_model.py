"""The tiny Qwen2.5-VL-architecture model: built from a seed, saved and reloaded offline, its
processor assembled where AutoProcessor cannot load, and forward, backward (into the vision
tower), M-RoPE positions and generation running on a CPU."""

from __future__ import annotations

import pytest
import torch

from plugrl_qwen2_vl.family import IMAGE_TEXT, VISION_TOKENS, Qwen2VLFamily
from plugrl_qwen2_vl.tiny import make_tiny_vl_model, make_tiny_vl_tokenizer
from tests.plugins.models.qwen2_vl.images import png_bytes


@pytest.fixture(scope="module")
def loaded(tiny_vl_model):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model)
    family = Qwen2VLFamily(str(tiny_vl_model), AutoConfig.from_pretrained(tiny_vl_model))
    return tokenizer, model, family, family.processor(tokenizer)


def image(color, size=(56, 56)):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(color, size))).convert("RGB")


def prompt_inputs(processor, images):
    text = (
        "<|im_start|>user\n"
        + IMAGE_TEXT * len(images)
        + "How many squares?<|im_end|>\n<|im_start|>assistant\n"
    )
    return processor(text=[text], images=images, return_tensors="pt")


def test_the_same_seed_builds_the_same_weights_and_another_seed_others():
    tokenizer = make_tiny_vl_tokenizer()
    first = make_tiny_vl_model(tokenizer, seed=3).state_dict()
    again = make_tiny_vl_model(tokenizer, seed=3).state_dict()
    other = make_tiny_vl_model(tokenizer, seed=4).state_dict()
    assert first.keys() == again.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(
        first["model.visual.patch_embed.proj.weight"], other["model.visual.patch_embed.proj.weight"]
    )
    assert sum(t.numel() for t in first.values()) < 300_000


def test_the_vision_tokens_are_single_ids_that_survive_a_reload(loaded):
    tokenizer = loaded[0]
    fresh = make_tiny_vl_tokenizer()
    text = f"<|im_start|>user\n{IMAGE_TEXT}What is drawn?<|im_end|>\n"
    assert tokenizer(text)["input_ids"] == fresh(text)["input_ids"]
    for token in VISION_TOKENS:
        assert len(tokenizer(token)["input_ids"]) == 1
        assert tokenizer.convert_tokens_to_ids(token) >= 381


def test_auto_processor_fails_without_torchvision_and_the_assembled_one_expands_images(
    loaded, tiny_vl_model
):
    from transformers import AutoProcessor

    try:
        import torchvision  # noqa: F401
    except Exception:
        with pytest.raises(ImportError):
            AutoProcessor.from_pretrained(tiny_vl_model)
    _, model, _, processor = loaded
    inputs = prompt_inputs(processor, [image((255, 0, 0)), image((0, 0, 255), (112, 56))])
    grids = inputs["image_grid_thw"]
    assert grids.tolist() == [[1, 4, 4], [1, 4, 8]]
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert image_tokens == int(grids.prod(-1).sum()) // 4
    assert inputs["pixel_values"].shape == (int(grids.prod(-1).sum()), 3 * 2 * 14 * 14)


def test_forward_backward_reach_the_vision_tower_and_positions_are_the_models(loaded):
    _, model, family, processor = loaded
    inputs = prompt_inputs(processor, [image((255, 0, 0))])
    positions = family.position_ids(
        inputs["input_ids"],
        inputs["attention_mask"],
        [{key: inputs[key] for key in family.input_keys}],
    )
    assert positions.shape == (1, 3, inputs["input_ids"].shape[1])
    # a 4 x 4 grid merged 2 x 2: the image's 4 tokens share a temporal position and take 2
    # heights and 2 widths; text after it continues from the largest
    start = int((inputs["input_ids"][0] == model.config.image_token_id).nonzero()[0])
    image_positions = positions[0, :, start : start + 4]
    assert image_positions[0].tolist() == [start] * 4
    assert image_positions[1].tolist() == [start, start, start + 1, start + 1]
    assert image_positions[2].tolist() == [start, start + 1, start, start + 1]
    assert positions[0, 0, start + 4] == start + 2
    model.zero_grad()
    out = model(**inputs, position_ids=positions.permute(1, 0, 2))
    reference = model(**inputs)
    torch.testing.assert_close(out.logits, reference.logits, rtol=0, atol=1e-6)
    out.logits.logsumexp(-1).sum().backward()
    vision_grad = model.model.visual.patch_embed.proj.weight.grad
    assert vision_grad is not None and vision_grad.abs().sum() > 0


def test_generate_runs_from_an_image_with_the_kv_cache(loaded):
    _, model, _, processor = loaded
    inputs = prompt_inputs(processor, [image((0, 255, 0))])
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False, use_cache=True)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    no_cache = model.generate(**inputs, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(out, no_cache)


def test_a_response_that_sampled_the_image_token_is_named(loaded):
    _, model, family, processor = loaded
    inputs = prompt_inputs(processor, [image((255, 0, 0))])
    image_token = torch.tensor([[model.config.image_token_id]])
    ids = torch.cat([inputs["input_ids"], image_token], dim=1)
    mask = torch.ones_like(ids)
    with pytest.raises(ValueError, match="row 0 holds 5 image tokens but its images expand to 4"):
        family.position_ids(ids, mask, [{key: inputs[key] for key in family.input_keys}])
    # a sampled video token is named too, where get_rope_index would fail looking for a video
    video_token = torch.tensor([[model.config.video_token_id]])
    ids = torch.cat([inputs["input_ids"], video_token], dim=1)
    with pytest.raises(ValueError, match="row 0 holds 1 video tokens but its videos expand to 0"):
        family.position_ids(ids, mask, [{key: inputs[key] for key in family.input_keys}])
