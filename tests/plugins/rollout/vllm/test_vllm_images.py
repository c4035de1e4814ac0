"""The vllm engine's requests with images, against vLLM's own types and a stand-in engine.

vLLM's CPU build cannot load a Qwen2-VL-family model here: its model module imports the
Qwen2-VL image processor of transformers, which needs torchvision, and no torchvision loads
against a CPU build of torch 2.13 (docs/vision.md). So the engine's vLLM is replaced by a
stand-in that records what it is given, and what it is given is checked with vLLM's own
prompt type and multimodal data parser.
"""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

pytest.importorskip("vllm")

from PIL import Image

from plugrl.parts.rollout import (
    Completion,
    GenerationRequest,
    SamplingParams,
    batch_requests,
    continuation_request,
)
from plugrl.recipe import ModelConfig, Recipe
from plugrl.testing import part_context
from plugrl_cpu.device import CpuDevice
from plugrl_vllm.config import VLLMRolloutConfig
from plugrl_vllm.engine import VLLMRolloutEngine
from plugrl_vllm.worker import Names

IMAGE, START, END = 90, 88, 89


def png(color: tuple[int, int, int], size: tuple[int, int] = (28, 28)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


class StandInLLMEngine:
    """Takes requests as vLLM's ``LLMEngine`` does (``add_request`` with a prompt and sampling
    parameters) and ends each at its next step with two tokens."""

    def __init__(self, hf_config: Any) -> None:
        self.model_config = SimpleNamespace(hf_config=hf_config)
        self.added: list[tuple[str, Any, Any]] = []
        self._pending: list[str] = []
        self.engine_core = SimpleNamespace(shutdown=lambda: None)

    def add_request(
        self, request_id: str, prompt: Any, params: Any, lora_request: Any = None
    ) -> None:
        assert lora_request is None
        self.added.append((request_id, prompt, params))
        self._pending.append(request_id)

    def step(self) -> list[Any]:
        logprobs = [{3: SimpleNamespace(logprob=-0.5)}, {4: SimpleNamespace(logprob=-0.25)}]
        finished = [
            SimpleNamespace(
                request_id=request_id,
                finished=True,
                outputs=[
                    SimpleNamespace(token_ids=[3, 4], logprobs=logprobs, finish_reason="stop")
                ],
            )
            for request_id in self._pending
        ]
        self._pending = []
        return finished

    def abort_request(self, request_ids: list[str]) -> None:
        self._pending = [i for i in self._pending if i not in request_ids]


def vision_config() -> Any:
    return SimpleNamespace(vision_config=SimpleNamespace(), image_token_id=IMAGE)


@pytest.fixture
def engine_with(monkeypatch, tiny_model_dir):
    """engine_with(hf_config) -> (the vllm engine over a stand-in vLLM, the stand-in); the
    recipe's model is the tiny text model, for vLLM's engine arguments to read."""
    from vllm.v1.engine.llm_engine import LLMEngine

    made: list[VLLMRolloutEngine] = []

    def build(hf_config: Any) -> tuple[VLLMRolloutEngine, StandInLLMEngine]:
        stand_in = StandInLLMEngine(hf_config)
        monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(lambda cls, args: stand_in))
        recipe = Recipe(model=ModelConfig(path=str(tiny_model_dir), dtype="float32"))
        engine = VLLMRolloutEngine(VLLMRolloutConfig(), part_context(recipe, device=CpuDevice()))
        made.append(engine)
        return engine, stand_in

    yield build
    for engine in made:
        engine.close()


def test_a_request_with_images_gives_vllm_one_token_per_image_and_the_decoded_images(
    engine_with,
):
    from vllm.multimodal.parse import MultiModalDataParser

    engine, vllm = engine_with(vision_config())
    red, green = png((255, 0, 0)), png((0, 255, 0), (56, 28))
    prompt = [1, START, *[IMAGE] * 4, END, 2, START, *[IMAGE] * 8, END, 5]
    (request,) = batch_requests(
        [prompt],
        SamplingParams(n=2, max_tokens=4, seed=3),
        "images",
        images=[{"pixel_values": None}],
        encoded_images=[(red, green)],
    )
    completions = asyncio.run(engine.generate_request(request))
    assert [c.token_ids for c in completions] == [[3, 4], [3, 4]]
    assert [c.log_probs for c in completions] == [[-0.5, -0.25], [-0.5, -0.25]]
    assert len(vllm.added) == 2
    for _, given, _ in vllm.added:
        assert given["prompt_token_ids"] == [1, START, IMAGE, END, 2, START, IMAGE, END, 5]
        images = given["multi_modal_data"]["image"]
        assert [image.size for image in images] == [(28, 28), (56, 28)]
        assert images[0].getpixel((0, 0)) == (255, 0, 0)
        assert images[1].getpixel((3, 3)) == (0, 255, 0)
        # vLLM reads them as two images
        parsed = MultiModalDataParser().parse_mm_data(given["multi_modal_data"])
        assert parsed.get_all_counts() == {"image": 2}

    # a continuation after an abort keeps the prompt's images
    partial = Completion(token_ids=[3], log_probs=[-0.5], finish_reason="aborted")
    asyncio.run(engine.generate_request(continuation_request(request, partial)))
    continued = vllm.added[-1][1]
    assert continued["prompt_token_ids"][-2:] == [5, 3]
    assert len(continued["multi_modal_data"]["image"]) == 2


def test_a_text_request_has_no_multimodal_data(engine_with):
    engine, vllm = engine_with(vision_config())
    request = GenerationRequest(
        request_id="text", prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=2)
    )
    asyncio.run(engine.generate_request(request))
    ((_, given, _),) = vllm.added
    assert given == {"prompt_token_ids": [1, 2, 3]}


def test_requests_with_images_vllm_cannot_take_are_one_line(engine_with):
    engine, _ = engine_with(vision_config())
    with_images = GenerationRequest(
        request_id="r",
        prompt_ids=[1, START, IMAGE, IMAGE, END],
        params=SamplingParams(max_tokens=2),
        multi_modal_inputs={"pixel_values": None},
        images=(png((1, 2, 3)),),
    )
    without_bytes = attrs.evolve(with_images, images=())
    with pytest.raises(ValueError, match=r"request 'r' has image inputs but not its images' enc"):
        asyncio.run(engine.generate_request(without_bytes))
    two_images = attrs.evolve(with_images, images=(png((1, 2, 3)), png((4, 5, 6))))
    with pytest.raises(ValueError, match=r"has 1 images in its prompt ids but 2 encoded images"):
        asyncio.run(engine.generate_request(two_images))
    broken = attrs.evolve(with_images, images=(b"not a picture",))
    with pytest.raises(Exception, match=r"image 0 of request 'r' .* cannot be decoded"):
        asyncio.run(engine.generate_request(broken))

    text_engine, _ = engine_with(SimpleNamespace(image_token_id=IMAGE))
    with pytest.raises(ValueError, match=r"request 'r' has images or videos but the vllm engine's"):
        asyncio.run(text_engine.generate_request(with_images))


def test_vllms_own_weights_mapper_renames_checkpoint_names_both_ways():
    from vllm.model_executor.models.utils import WeightsMapper

    mapper = WeightsMapper(
        orig_to_new_stacked={".self_attn.q_proj.": (".self_attn.qkv_proj.", "q")},
        orig_to_new_prefix={
            "model.language_model.": "language_model.model.",
            "model.visual.": "visual.",
            "lm_head.": "language_model.lm_head.",
            "model.": "language_model.model.",
        },
    )
    names = Names.of_model(SimpleNamespace(hf_to_vllm_mapper=mapper))
    assert names.to_model("model.visual.blocks.0.attn.qkv.weight") == (
        "visual.blocks.0.attn.qkv.weight"
    )
    assert names.to_model("model.language_model.norm.weight") == "language_model.model.norm.weight"
    # a shard of a fused layer keeps its name: the plan and the read-back resolve it
    assert names.to_model("model.language_model.layers.0.self_attn.q_proj.weight") == (
        "language_model.model.layers.0.self_attn.q_proj.weight"
    )
    assert names.to_checkpoint("language_model.lm_head.weight") == "lm_head.weight"
    assert names.to_checkpoint("visual.merger.mlp.0.weight") == "model.visual.merger.mlp.0.weight"
    # a model without a mapper names its modules as the checkpoint
    assert Names.of_model(SimpleNamespace()).to_model("lm_head.weight") == "lm_head.weight"


VIDEO = 91


def test_a_request_with_videos_gives_vllm_one_token_per_video_and_the_frames(engine_with):
    """Each video's run of tokens shortened to one, its frames ``[T, H, W, 3]`` with the
    metadata that tells vLLM's processor they are sampled already, at their rate."""
    from vllm.multimodal.parse import MultiModalDataParser

    config = SimpleNamespace(vision_config=SimpleNamespace(), image_token_id=IMAGE)
    config.video_token_id = VIDEO
    engine, vllm = engine_with(config)
    clip = {"frames": (png((255, 0, 0)), png((0, 0, 255)), png((0, 255, 0))), "fps": 1.5}
    prompt = [1, START, *[IMAGE] * 4, END, START, *[VIDEO] * 8, END, 2]
    (request,) = batch_requests(
        [prompt],
        SamplingParams(n=1, max_tokens=4),
        "videos",
        images=[{"pixel_values": None}],
        encoded_images=[(png((9, 9, 9)),)],
        encoded_videos=[(clip,)],
    )
    asyncio.run(engine.generate_request(request))
    ((_, given, _),) = vllm.added
    assert given["prompt_token_ids"] == [1, START, IMAGE, END, START, VIDEO, END, 2]
    ((frames, metadata),) = given["multi_modal_data"]["video"]
    assert frames.shape == (3, 28, 28, 3)
    assert frames[1, 0, 0].tolist() == [0, 0, 255]
    assert metadata["fps"] == 1.5 and metadata["frames_indices"] == [0, 1, 2]
    parsed = MultiModalDataParser(video_needs_metadata=True).parse_mm_data(
        given["multi_modal_data"]
    )
    assert parsed.get_all_counts() == {"image": 1, "video": 1}
    # a continuation after an abort keeps them
    partial = Completion(token_ids=[3], log_probs=[-0.5], finish_reason="aborted")
    asyncio.run(engine.generate_request(continuation_request(request, partial)))
    assert len(vllm.added[-1][1]["multi_modal_data"]["video"]) == 1
    # two videos given for one in the prompt
    twice = attrs.evolve(request, videos=(clip, clip))
    with pytest.raises(ValueError, match=r"has 1 videos in its prompt ids but 2 encoded videos"):
        asyncio.run(engine.generate_request(twice))
