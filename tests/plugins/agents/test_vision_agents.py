"""Agent loops with images, on the tiny vision-language model and the hf engine: a prompt with an
image, a "zoom" tool whose result carries a crop, the crop's tokens appended between turns
(not trained), every image's inputs in the trajectory and the batch in order, the positions
the model's own over the whole multi-turn sequence, and the trainer's log-probs the engine's."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import attrs
import pytest
import torch

import plugrl
from plugrl.agents.batch import agent_rows, build_trajectory_batch
from plugrl.agents.images import TurnImages
from plugrl.agents.session import AgentRuntime, ToolCaller
from plugrl.config import option
from plugrl.data.batch import MULTIMODAL_COLUMN, Batch
from plugrl.data.dataset import load_tokenizer
from plugrl.data.multimodal import add_model_positions, load_multimodal, model_inputs
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import (
    AgentConfig,
    AgentLoop,
    Environment,
    EnvironmentConfig,
    ParsedTurn,
    StepResult,
    Tool,
    ToolCall,
    ToolConfig,
    ToolResult,
    Trajectory,
)
from plugrl.parts.rollout import SamplingParams
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_recipe
from tests.plugins.models.qwen2_vl.images import png_bytes
from tests.plugins.rollout.hf.test_hf_vision import make_engine

PROMPT = [{"role": "user", "content": "<image>Zoom in, then count the squares."}]
CROP_TEXT = "The crop: <image> (top left)."
ZOOM_AGENT = {
    "data.max_response_length": 96,
    "rollout.agent.tools": ["zoom"],
    "rollout.agent.tool_parser": "always_zoom",
    "rollout.agent.max_turns": 2,
    "rollout.agent.max_turn_tokens": 6,
}
"""The agent keys of the runs here: the zoom tool, called at every turn, two turns."""


@attrs.define(kw_only=True)
class ZoomConfig(ToolConfig):
    side: int = option(56, "The crop's side in pixels.")


class ZoomTool(Tool):
    """Returns a crop of a picture of its own as the result's image (PNG bytes)."""

    name = "zoom"

    def schema(self):
        return {"type": "function", "function": {"name": "zoom", "parameters": {}}}

    async def call(self, arguments, context):
        side = self.config.side
        return ToolResult(text=CROP_TEXT, images=[png_bytes((0, 90, 200), (side, side))])


class BrokenImageTool(Tool):
    name = "broken"

    def schema(self):
        return {"type": "function", "function": {"name": "broken", "parameters": {}}}

    async def call(self, arguments, context):
        return ToolResult(text="here", images=[b"not a picture"])


@attrs.define(kw_only=True)
class ShowConfig(EnvironmentConfig):
    image: bytes | None = option(None, "The observation's image, PNG bytes (a crop otherwise).")


class ShowEnvironment(Environment):
    """Answers the first message with an observation that shows an image; done after two."""

    async def reset(self, row):
        self.steps = 0

    async def step(self, message):
        self.steps += 1
        image = self.config.image or png_bytes((200, 30, 30), (56, 56))
        return StepResult(
            observation="Look: <image>", images=[image], reward=0.5, done=self.steps == 2
        )


class TextOnlyLoop(AgentLoop):
    """A loop that does not carry the row's images."""

    async def run(self, row, session):
        return Trajectory(prompt_ids=list(row["raw_prompt_ids"]))


def always_zoom(text: str) -> ParsedTurn:
    """Every turn calls zoom: the tiny model writes noise, not calls."""
    return ParsedTurn(
        content=text, tool_calls=[ToolCall(id="call_0", name="zoom", arguments={}, raw=text)]
    )


class VisionAgentPlugin:
    @plugrl.hookimpl
    def register_tools(self, register):
        register("zoom", f"{__name__}:ZoomTool", config=f"{__name__}:ZoomConfig")

    @plugrl.hookimpl
    def register_tool_parsers(self, register):
        register("always_zoom", f"{__name__}:always_zoom")

    @plugrl.hookimpl
    def register_agent_loops(self, register):
        register("text_only", f"{__name__}:TextOnlyLoop")

    @plugrl.hookimpl
    def register_environments(self, register):
        register("show", f"{__name__}:ShowEnvironment", config=f"{__name__}:ShowConfig")


class OneEngine:
    """The engine group of one hf engine; every request is kept."""

    def __init__(self, engine):
        self.engine = engine
        self.requests = []

    async def agenerate(self, request):
        self.requests.append(request)
        return await self.engine.generate_request(request)


@pytest.fixture(scope="module")
def vision(tiny_vl_model):
    """(tokenizer, multimodal processing, hf engine, the prompt row) of the tiny model."""
    from PIL import Image

    model = ModelConfig(path=str(tiny_vl_model))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    picture = Image.open(io.BytesIO(png_bytes((250, 200, 0), (84, 56)))).convert("RGB")

    def render(messages):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    encoded = multimodal.encode(
        PROMPT,
        [picture],
        origin="row 0",
        prompt_key="prompt",
        image_key="images",
        folder=None,
        use_template=True,
        render=render,
    )
    prompts = Batch(
        {"index": torch.tensor([0])},
        {
            "uid": ["u"],
            "prompt": [PROMPT],
            "raw_prompt_ids": [encoded.prompt_ids],
            MULTIMODAL_COLUMN: [encoded.inputs],
        },
    )
    return tokenizer, multimodal, make_engine(tiny_vl_model, tokenizer), prompts


@pytest.fixture
def run_agents(vision, tiny_vl_model, plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin):
    """run_agents(loop, **recipe overrides) -> (trajectory, engine group, prompt batch)."""
    tokenizer, multimodal, engine, prompts = vision
    plugrl_register_plugin(VisionAgentPlugin(), "vision-agent-test")
    built = []

    def run(loop, **overrides):
        recipe = plugrl_recipe({"model.path": str(tiny_vl_model), **ZOOM_AGENT, **overrides})
        engines = OneEngine(engine)
        runtime = AgentRuntime(recipe, plugrl_plugin_manager, tokenizer, engines, multimodal)
        built.append(runtime)
        params = SamplingParams(n=1, seed=5, temperature=1.0, max_tokens=96)
        [[[trajectory]]] = runtime.run(agent_rows(prompts), [loop], params)
        engines.runtime, engines.params = runtime, params
        return trajectory, engines

    yield run
    for runtime in built:
        runtime.close()


def test_a_tool_result_with_an_image_joins_the_trajectory_and_trains_as_the_engine_sampled(
    vision, tiny_vl_model, run_agents
):
    tokenizer, multimodal, _, prompts = vision
    config = multimodal.family.hf_config
    trajectory, engines = run_agents("tool")
    first, second = engines.requests
    assert (trajectory.finish_reason, trajectory.num_turns) == ("max_turns", 2)
    vision_ids = multimodal.vision_token_ids
    assert not any(
        t in vision_ids
        for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True)
        if m
    )

    # layout: prompt (its image expanded) | turn 1 | tool result with the crop | turn 2
    prompt_ids = list(prompts["raw_prompt_ids"][0])
    assert trajectory.prompt_ids == prompt_ids == list(first.prompt_ids)
    mask = trajectory.loss_mask
    turn_one = mask.index(0)
    turn_two = turn_one + mask[turn_one:].index(1)
    assert mask == [1] * turn_one + [0] * (turn_two - turn_one) + [1] * (len(mask) - turn_two)
    appended = trajectory.response_ids[turn_one:turn_two]
    crop_inputs = trajectory.image_inputs[1]
    crop_tokens = (
        int(crop_inputs["image_grid_thw"].prod()) // config.vision_config.spatial_merge_size**2
    )
    assert appended.count(config.image_token_id) == crop_tokens == 4
    text = tokenizer.decode(appended)
    assert "<|im_start|>tool\nThe crop: <|vision_start|><|image_pad|>" in text
    assert text.endswith("<|vision_end|> (top left).<|im_end|>\n<|im_start|>assistant\n")
    assert list(second.prompt_ids) == prompt_ids + trajectory.response_ids[:turn_two]

    # every image's inputs, in order: the prompt's, then the crop's; the engine saw them
    assert len(trajectory.image_inputs) == 2
    assert torch.equal(
        trajectory.image_inputs[0]["pixel_values"], prompts[MULTIMODAL_COLUMN][0]["pixel_values"]
    )
    assert first.multi_modal_inputs["image_grid_thw"].shape[0] == 1
    joined = model_inputs(trajectory.image_inputs)
    assert torch.equal(second.multi_modal_inputs["pixel_values"], joined["pixel_values"])
    assert torch.equal(second.multi_modal_inputs["image_grid_thw"], joined["image_grid_thw"])
    assert trajectory.messages[-2]["role"] == "tool"

    # the batch: the images of the whole trajectory, positions the model's own over all of it
    batch = build_trajectory_batch(prompts, [[[trajectory]]], pad_token_id=tokenizer.pad_token_id)
    batch = add_model_positions(batch, multimodal.family)
    row_inputs = batch[MULTIMODAL_COLUMN][0]
    assert torch.equal(row_inputs["pixel_values"], joined["pixel_values"])
    response_mask = batch["response_mask"][0].tolist()
    assert response_mask[: len(mask)] == mask and not any(response_mask[len(mask) :])
    assert batch["attention_mask"][0, -batch["responses"].shape[1] :].sum() == len(mask)
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model).eval()
    ids = batch["input_ids"]
    expected, _ = model.model.get_rope_index(
        ids,
        mm_token_type_ids=(ids == config.image_token_id).long(),
        image_grid_thw=row_inputs["image_grid_thw"],
        attention_mask=batch["attention_mask"],
    )
    attended = batch["attention_mask"][0].bool()
    got = batch["position_ids"][0]
    assert torch.equal(got[:, attended], expected[:, 0, attended])
    # the crop's tokens lie on its grid: two heights and two widths
    crop_columns = attended.nonzero().squeeze(-1)[len(prompt_ids) + turn_one :][: len(appended)]
    crop_positions = got[:, crop_columns][:, torch.tensor(appended) == config.image_token_id]
    assert crop_positions[1].unique().numel() == 2 and crop_positions[2].unique().numel() == 2

    # a run's step builds the same batch: the same samples (seeded), the model's positions
    from plugrl.compose.run_parts import RunParts
    from plugrl.run.steps import generate_with_agents

    parts = SimpleNamespace(
        agent_runtime=lambda: engines.runtime,
        pad_token_id=tokenizer.pad_token_id,
        multimodal=multimodal,
    )
    parts.with_model_positions = lambda rows: RunParts.with_model_positions(parts, rows)
    stepped = generate_with_agents(parts, prompts, engines.params, ["tool"])
    for name in ("input_ids", "response_mask", "position_ids", "rollout_log_probs"):
        assert torch.equal(stepped[name], batch[name]), name
    assert torch.equal(stepped[MULTIMODAL_COLUMN][0]["pixel_values"], joined["pixel_values"])

    # the trainer's log-probs on the batch are the engine's, turn 2 (after the crop) included
    backend = make_backend(
        make_recipe(tiny_vl_model, ppo_mini_batch_size=1, use_remove_padding=True)
    )
    trainer = backend.compute_log_prob(batch)["log_probs"]
    trained = batch["response_mask"].bool()
    assert trained[0, turn_two:].sum() > 0
    torch.testing.assert_close(
        trainer[trained], batch["rollout_log_probs"][trained], atol=1e-5, rtol=0
    )


def test_an_observation_with_an_image_joins_the_trajectory(vision, run_agents):
    tokenizer, multimodal, _, _ = vision
    trajectory, engines = run_agents(
        "env",
        **{"rollout.agent.env": "show", "rollout.agent.tools": [], "rollout.agent.max_turns": 3},
    )
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 2)
    assert len(trajectory.image_inputs) == 2  # the prompt's image, the first observation's
    appended = [
        t for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if not m
    ]
    image_id = multimodal.family.hf_config.image_token_id
    assert appended.count(image_id) == 4
    assert "<|im_start|>user\nLook: <|vision_start|>" in tokenizer.decode(appended)
    joined = model_inputs(trajectory.image_inputs)
    assert torch.equal(
        engines.requests[1].multi_modal_inputs["pixel_values"], joined["pixel_values"]
    )


def test_images_that_could_never_fit_the_response_budget_stop_the_run_in_one_line(run_agents):
    with pytest.raises(
        RecipeError,
        match=r"^data\.max_response_length: sample u/0: the 1 images of a turn's tool results "
        r"are 18 tokens, more than data\.max_response_length=16 holds; raise it or return "
        r"smaller images$",
    ):
        run_agents(
            "tool",
            **{
                "data.max_response_length": 16,
                "rollout.agent.max_turn_tokens": 2,
                "rollout.agent.tool_args": {"zoom": {"side": 112}},
            },
        )


def test_an_observation_image_that_cannot_be_decoded_ends_its_trajectory_in_one_line(run_agents):
    trajectory, _ = run_agents(
        "env",
        **{
            "rollout.agent.env": "show",
            "rollout.agent.tools": [],
            "rollout.agent.env_args": {"image": b"garbage"},
        },
    )
    assert trajectory.finish_reason == "error"
    assert trajectory.error.startswith(
        "agent loop 'env', sample u/0: environment ShowEnvironment observation: image 0 "
        "(7 bytes) cannot be decoded as an image ("
    )
    assert trajectory.error.endswith(
        '); return PIL images, PNG or JPEG bytes, {"bytes": ...} or a path to an image file'
    )


def test_a_tool_image_the_run_cannot_show_is_a_failed_call_the_model_reads(vision):
    tokenizer, multimodal, _, _ = vision
    raised = []
    tools = {"broken": BrokenImageTool(ToolConfig(), None), "zoom": ZoomTool(ZoomConfig(), None)}

    def caller(images):
        return ToolCaller(
            tools,
            AgentConfig(),
            tokenizer,
            sample_id="u/0",
            images=images,
            record_raise=lambda name, exc: raised.append(name),
        )

    def call(caller, name):
        calls = [ToolCall(id="c", name=name, arguments={}, raw="")]
        (result,) = asyncio.run(caller.call_all(calls, {}))
        return result

    broken = call(caller(TurnImages(multimodal, tokenizer)), "broken")
    assert broken.error and not broken.images
    assert broken.text.startswith(
        "Error: tool 'broken' result: image 0 (13 bytes) cannot be decoded as an image ("
    )
    text_model = call(caller(None), "zoom")
    assert text_model.error
    assert text_model.text == (
        "Error: tool 'zoom' result has 1 images, but the run's model is not a vision-language "
        "model; return images only to a vision-language model"
    )
    assert raised == ["broken", "zoom"]
    good = call(caller(TurnImages(multimodal, tokenizer)), "zoom")
    assert not good.error and good.images[0].size == (56, 56)


def test_a_loop_that_drops_the_rows_images_stops_the_run_in_one_line(run_agents):
    with pytest.raises(
        PluginError,
        match=r"^agent loop 'text_only' returned a trajectory without the image inputs of "
        r"sample u/0's prompt images; a loop for rows with images puts them in "
        r"Trajectory.image_inputs",
    ):
        run_agents("text_only")


def test_a_prompt_with_a_video_keeps_it_through_a_tool_loop(
    vision, tiny_vl_model, plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin
):
    """The tool loop renders the prompt again with its tools: the video's tokens are expanded
    from the row's video inputs, the crop's image joins them, and the trainer's log-probs on
    the batch (positions over the video and the image) are the engine's."""
    from tests.plugins.models.qwen2_vl.videos import frame_list

    tokenizer, multimodal, engine, _ = vision
    config = multimodal.family.hf_config
    plugrl_register_plugin(VisionAgentPlugin(), "vision-agent-test")
    messages = [{"role": "user", "content": "<video>Zoom in, then say what moves."}]
    encoded = multimodal.encode(
        messages,
        [],
        origin="row 0",
        prompt_key="prompt",
        image_key="images",
        folder=None,
        use_template=True,
        render=lambda m: tokenizer.apply_chat_template(
            m, add_generation_prompt=True, tokenize=False
        ),
        videos=[{"video": frame_list(4), "fps": 4.0}],
    )
    prompts = Batch(
        {"index": torch.tensor([0])},
        {
            "uid": ["u"],
            "prompt": [messages],
            "raw_prompt_ids": [encoded.prompt_ids],
            MULTIMODAL_COLUMN: [encoded.inputs],
        },
    )
    recipe = plugrl_recipe({"model.path": str(tiny_vl_model), **ZOOM_AGENT})
    engines = OneEngine(engine)
    runtime = AgentRuntime(recipe, plugrl_plugin_manager, tokenizer, engines, multimodal)
    try:
        params = SamplingParams(n=1, seed=5, temperature=1.0, max_tokens=96)
        [[[trajectory]]] = runtime.run(agent_rows(prompts), ["tool"], params)
    finally:
        runtime.close()
    assert trajectory.prompt_ids == list(encoded.prompt_ids)
    assert trajectory.prompt_ids.count(config.video_token_id) == 8
    assert [sorted(inputs) for inputs in trajectory.image_inputs] == [
        ["pixel_values_videos", "second_per_grid_ts", "video_grid_thw"],
        ["image_grid_thw", "pixel_values"],
    ]
    second = engines.requests[1]
    assert set(second.multi_modal_inputs) == {
        "pixel_values_videos",
        "second_per_grid_ts",
        "video_grid_thw",
        "pixel_values",
        "image_grid_thw",
    }
    batch = build_trajectory_batch(prompts, [[[trajectory]]], pad_token_id=tokenizer.pad_token_id)
    batch = add_model_positions(batch, multimodal.family)
    backend = make_backend(
        make_recipe(tiny_vl_model, ppo_mini_batch_size=1, use_remove_padding=True)
    )
    trainer = backend.compute_log_prob(batch)["log_probs"]
    trained = batch["response_mask"].bool()
    assert trained.sum() > 0
    torch.testing.assert_close(
        trainer[trained], batch["rollout_log_probs"][trained], atol=1e-5, rtol=0
    )
