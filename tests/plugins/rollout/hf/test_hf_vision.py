"""The hf engine generating from images: prompt passes take the rows' image inputs and the
model's M-RoPE positions, decode steps keep the KV cache, greedy tokens equal
``model.generate``'s, and sampled log-probs equal the fsdp2 trainer's on the batch built from
them."""

from __future__ import annotations

import asyncio
import io

import pytest
import torch

from plugrl.data.batch import MULTIMODAL_COLUMN, Batch, left_pad
from plugrl.data.dataset import load_tokenizer
from plugrl.data.multimodal import add_model_positions, load_multimodal
from plugrl.data.rollout_batch import build_rollout_batch
from plugrl.parts.rollout import GenerationRequest, SamplingParams
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig, Recipe, TrainerConfig
from plugrl.testing import part_context
from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_recipe
from tests.plugins.models.qwen2_vl.images import png_bytes

# (question, image sizes, colour)
PROMPTS = [
    ("How many squares?", [(56, 56)], (255, 0, 0)),
    ("Compare them.", [(112, 56), (56, 56)], (0, 200, 30)),
    ("Say hello.", [], None),
    ("What colour is it?", [(56, 112)], (20, 20, 220)),
]


@pytest.fixture(scope="module")
def prompts(tiny_vl_model):
    """Prompt ids and image inputs, as the dataset makes them."""
    from PIL import Image

    model = ModelConfig(path=str(tiny_vl_model))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    ids, inputs = [], []
    for question, sizes, colour in PROMPTS:
        images = [Image.open(io.BytesIO(png_bytes(colour, size))).convert("RGB") for size in sizes]
        content = multimodal.family.image_text() * len(images) + question
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        out = multimodal.processor(text=[text], images=images or None, return_tensors="pt")
        ids.append(out["input_ids"][0].tolist())
        inputs.append({k: out[k] for k in multimodal.family.input_keys} if images else None)
    return tokenizer, multimodal, ids, inputs


def make_engine(model_dir, tokenizer):
    config = HFRolloutConfig()
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir)), rollout=config, trainer=TrainerConfig(seed=0)
    )
    context = part_context(recipe, device=CpuDevice(), tokenizer=tokenizer)
    return HFRolloutEngine(config, context)


@pytest.fixture(scope="module")
def engine(tiny_vl_model, prompts):
    return make_engine(tiny_vl_model, prompts[0])


def run(engine, ids, inputs, params):
    requests = [
        GenerationRequest(request_id=f"r{i}", prompt_ids=p, params=params, multi_modal_inputs=x)
        for i, (p, x) in enumerate(zip(ids, inputs, strict=True))
    ]

    async def all_requests():
        return await asyncio.gather(*(engine.generate_request(r) for r in requests))

    return asyncio.run(all_requests())


def greedy_reference(model, config, prompt: list[int], row_inputs) -> list[int]:
    """``model.generate``'s 8 greedy tokens after ``prompt``, cut after the first stop token:
    what the engine must sample. Token types mark the image (1) and video (2) placeholders of
    ``config``; ``row_inputs`` are the row's vision inputs (None: a text prompt)."""
    prompt_ids = torch.tensor([prompt])
    types = (prompt_ids == config.image_token_id).long()
    types += 2 * (prompt_ids == config.video_token_id).long()
    with torch.no_grad():
        expected = model.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            mm_token_type_ids=types,
            max_new_tokens=8,
            do_sample=False,
            use_cache=True,
            **(row_inputs or {}),
        )[0, len(prompt) :].tolist()
    stops = set(model.generation_config.eos_token_id)
    if any(token in stops for token in expected):
        expected = expected[: next(i for i, t in enumerate(expected) if t in stops) + 1]
    return expected


def test_greedy_tokens_from_images_equal_model_generate(tiny_vl_model, prompts, engine):
    from transformers import AutoModelForImageTextToText

    _, multimodal, ids, inputs = prompts
    outputs = run(engine, ids, inputs, SamplingParams(n=1, temperature=0.0, max_tokens=8))
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model).eval()
    for prompt, row_inputs, (completion,) in zip(ids, inputs, outputs, strict=True):
        assert completion.token_ids == greedy_reference(
            model, multimodal.family.hf_config, prompt, row_inputs
        )


def test_sampled_log_probs_equal_the_trainers_on_the_batch(tiny_vl_model, prompts, engine):
    tokenizer, multimodal, ids, inputs = prompts
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=11)
    completions = [c for group in run(engine, ids, inputs, params) for c in group]
    for index, completion in enumerate(completions):
        completion.prompt_index = index // 2
    vision_ids = multimodal.vision_token_ids
    assert not any(t in vision_ids for c in completions for t in c.token_ids)
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    prompt_batch = Batch(
        {"prompts": prompt_ids, "prompt_attention_mask": prompt_mask},
        {MULTIMODAL_COLUMN: inputs},
    )
    batch = build_rollout_batch(prompt_batch, completions, n=2, pad_token_id=tokenizer.pad_token_id)
    batch = add_model_positions(batch, multimodal.family)
    backend = make_backend(
        make_recipe(tiny_vl_model, ppo_mini_batch_size=8, use_remove_padding=True)
    )
    trainer = backend.compute_log_prob(batch)["log_probs"]
    mask = batch["response_mask"].bool()
    assert mask.sum() > 8
    torch.testing.assert_close(trainer[mask], batch["rollout_log_probs"][mask], atol=1e-5, rtol=0)


def test_a_text_engine_refuses_a_request_with_images(tiny_model_dir, tokenizer, prompts):
    from tests.plugins.rollout.hf.test_hf_engine import make_engine as make_text_engine

    engine = make_text_engine(tiny_model_dir, tokenizer)
    request = GenerationRequest(
        request_id="img",
        prompt_ids=[1, 2, 3],
        params=SamplingParams(n=1, max_tokens=2),
        multi_modal_inputs=prompts[3][0],
    )
    with pytest.raises(
        ValueError, match="request 'img' has images or videos, but the engine's model"
    ):
        asyncio.run(engine.generate_request(request))


def test_greedy_tokens_from_videos_equal_model_generate(tiny_vl_model, prompts, engine):
    """A prompt with an image and a video, and one with two videos: the prompt pass takes the
    video inputs and the positions their seconds per temporal patch space out."""
    import numpy as np
    from PIL import Image
    from transformers import AutoModelForImageTextToText
    from transformers.video_utils import VideoMetadata

    from tests.plugins.models.qwen2_vl.videos import frame_list

    tokenizer, multimodal, _, _ = prompts
    family = multimodal.family
    ids, inputs = [], []
    for count, videos, fps in ((1, 1, 4.0), (0, 2, 1.0)):
        image = Image.open(io.BytesIO(png_bytes((255, 0, 0), (56, 56)))).convert("RGB")
        frames = [
            np.stack([np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in frame_list(4)])
        ] * videos
        content = family.image_text() * count + family.video_text() * videos + "What moves?"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        out = multimodal.processor(
            text=[text],
            images=[image] * count or None,
            videos=frames,
            video_metadata=[VideoMetadata(total_num_frames=4, fps=fps, frames_indices=[0, 1, 2, 3])]
            * videos,
            do_sample_frames=False,
            return_tensors="pt",
        )
        ids.append(out["input_ids"][0].tolist())
        keys = (family.input_keys if count else ()) + family.video_input_keys
        inputs.append({k: torch.as_tensor(out[k]) for k in keys})
    outputs = run(engine, ids, inputs, SamplingParams(n=1, temperature=0.0, max_tokens=8))
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model).eval()
    for prompt, row_inputs, (completion,) in zip(ids, inputs, outputs, strict=True):
        expected = greedy_reference(model, family.hf_config, prompt, row_inputs)
        assert completion.token_ids == expected
        assert len(completion.token_ids) > 1
