"""The ``openai`` loop over a real engine: the tiny model's random text (stray special tokens,
token splits the tokenizer would merge) goes through the client and back, and each
conversation stays one trajectory whose recorded log-probs are the model's own for exactly
those tokens, as a teacher-forced pass over the trajectory gives them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from plugrl.parts.agent import AgentConfig, Environment, ParsedTurn, Session, ToolCall
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import Completion, GenerationRequest, SamplingParams
from plugrl.recipe import ModelConfig, Recipe, TrainerConfig
from plugrl.testing import part_context, save_tiny_model

pytest.importorskip("openai")

from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from plugrl_openai_agent.loop import OpenAILoop, OpenAILoopConfig

AGENT = "tests.plugins.agents.openai_agent.agents:chatty"
QUESTIONS = ["What is 12 + 34?", "Hi", "Say something.", "What is 99 + 1?"]


class EngineSession(Session):
    """A sample's turns sampled by ``engine`` at temperature 1, seeded per sample and turn."""

    def __init__(self, engine: Any, tokenizer: Any, sample_id: str, seed: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sample_id = sample_id
        self.config = AgentConfig(max_turns=3)
        self.max_response_length = 96
        self._seed = seed
        self._turns = itertools.count()

    async def generate(self, token_ids: Sequence[int], max_tokens: int) -> Completion:
        turn = next(self._turns)
        request = GenerationRequest(
            request_id=f"{self.sample_id}#{turn}",
            prompt_ids=tuple(token_ids),
            params=SamplingParams(max_tokens=min(max_tokens, 24), seed=self._seed * 10 + turn),
        )
        [completion] = await self.engine.generate_request(request)
        return completion

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text)

    async def call_tools(self, calls: Sequence[ToolCall], row: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    def make_environment(self) -> Environment:
        raise NotImplementedError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # a large spread of weights gives varied text rather than one repeated token
    return save_tiny_model(tmp_path_factory.mktemp("tiny-agent"), seed=0, weight_std=0.15)


@pytest.mark.slow
def test_black_box_conversations_train_on_exactly_what_was_sampled(model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = HFRolloutConfig()
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir), dtype="float32"),
        rollout=config,
        trainer=TrainerConfig(seed=0),
    )
    engine = HFRolloutEngine(
        config, PartContext(recipe=recipe, device=CpuDevice(), tokenizer=tokenizer)
    )
    loop = OpenAILoop(OpenAILoopConfig(agent=AGENT), part_context())

    async def main() -> list[list[Any]]:
        runs = []
        for index, question in enumerate(QUESTIONS):
            session = EngineSession(engine, tokenizer, f"u{index}/0", seed=index)
            row = {"prompt": [{"role": "user", "content": question}]}
            runs.append(loop.run(row, session))
        return await asyncio.gather(*runs)

    try:
        samples = asyncio.run(main())
    finally:
        loop.close()
        engine.close()

    # the random text does not survive the client's round trip as the same tokens: without
    # the sampled ids put back, these conversations would break into sequences
    assert sum(t.metrics["endpoint_substituted_prompts"] for [t] in samples) > 0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for trajectories in samples:
        [trajectory] = trajectories  # each conversation is one trajectory
        trajectory.check()
        assert trajectory.num_turns == 3 and trajectory.metrics["agent_errors"] == 0
        ids = torch.tensor([trajectory.prompt_ids + trajectory.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        start = len(trajectory.prompt_ids)
        targets = ids[0, start:]
        forced = torch.log_softmax(logits[start - 1 : -1], dim=-1).gather(1, targets[:, None])[:, 0]
        sampled = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
        assert torch.allclose(
            forced[sampled], torch.tensor(trajectory.log_probs)[sampled], atol=2e-3
        )
