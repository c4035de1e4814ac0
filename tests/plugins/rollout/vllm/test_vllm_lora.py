"""Adapter-only weight sync (``rollout.lora_sync=adapters``) into vLLM's CPU build: the fsdp2
LoRA actor sends its adapters' factors alone, the engine keeps the base it loaded and applies
the latest adapter to every request.

Runs where vLLM is installed (``plugins/rollout/vllm/test-env.sh``); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from plugrl.parts.context import DistInfo, PartContext
from plugrl.parts.rollout import (
    SamplingParams,
    fingerprint_difference,
    is_adapter_weight,
    weight_fingerprint,
)
from plugrl.recipe import ClusterConfig, DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl.testing import make_batch, part_context
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from plugrl_fsdp2.config import FSDP2ActorConfig
from plugrl_vllm.config import VLLMRolloutConfig
from plugrl_vllm.engine import VLLMRolloutEngine

from .test_vllm_engine import LOG_PROB_TOLERANCE, PROMPTS, Loop, stop_ids

RANK = 8


@pytest.fixture(scope="module")
def loop():
    runner = Loop()
    yield runner
    runner.loop.close()


@pytest.fixture(scope="module")
def recipe(tiny_model_dir: Path) -> Recipe:
    return Recipe(
        model=ModelConfig(
            path=str(tiny_model_dir), dtype="float32", lora_rank=RANK, lora_alpha=2 * RANK
        ),
        data=DataConfig(max_prompt_length=32, max_response_length=64),
        actor=FSDP2ActorConfig(ppo_mini_batch_size=8),
        rollout=VLLMRolloutConfig(engine="vllm", lora_sync="auto"),
        cluster=ClusterConfig(mode="local", num_cpus=2),
        trainer=TrainerConfig(seed=5),
    )


@pytest.fixture(scope="module")
def engine(loop: Loop, recipe: Recipe, tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def build() -> VLLMRolloutEngine:
        context = part_context(recipe, device=CpuDevice(), tokenizer=tokenizer)
        return VLLMRolloutEngine(recipe.rollout, context)

    built = loop.run(build())
    yield built
    built.close()


@pytest.fixture(scope="module")
def actor(recipe: Recipe) -> FSDP2Backend:
    backend = FSDP2Backend(
        recipe.actor, PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo())
    )
    backend.setup(1)
    return backend


def draw_adapters(backend: FSDP2Backend, seed: int) -> None:
    """New values for every adapter factor (lora_B starts at zero: no change to the model)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in backend.model.named_parameters():
            if ".lora_" in name:
                # one rank: the local shard is the whole factor
                parameter.to_local().normal_(0.0, 0.2, generator=generator)


def push(loop: Loop, engine: VLLMRolloutEngine, backend: FSDP2Backend, version: int) -> int:
    """Push the backend's weights as a transport does (buckets of 64 KiB, reused after each
    call); returns the bytes sent."""
    metas = backend.weight_metadata()
    sent = 0

    async def run() -> None:
        nonlocal sent
        await engine.begin_weight_update(version, metas)
        for weights in backend.weight_buckets(64 * 1024):
            # copies: the backend may hand out its own parameters
            bucket = [(name, tensor.clone()) for name, tensor in weights]
            await engine.load_weights(bucket)
            sent += sum(tensor.nbytes for _, tensor in bucket)
            for _, tensor in bucket:
                tensor.fill_(float("nan"))
        await engine.finish_weight_update()

    loop.run(run())
    return sent


def engine_log_probs(completions: list[Any], like: torch.Tensor) -> torch.Tensor:
    got = torch.zeros_like(like)
    for row, completion in enumerate(completions):
        got[row, : len(completion.log_probs)] = torch.tensor(completion.log_probs)
    return got


def test_log_probs_after_an_adapter_sync_match_the_trainers(loop, engine, actor):
    assert engine.takes_adapters and actor.sync_adapters
    draw_adapters(actor, seed=1)
    metas = actor.weight_metadata()
    assert metas and all(is_adapter_weight(meta.name) for meta in metas)
    sent = push(loop, engine, actor, version=1)
    merged_bytes = sum(t.nbytes for _, t in actor._merged_weights())
    assert sent < merged_bytes / 4, (sent, merged_bytes)

    params = SamplingParams(n=2, temperature=0.7, max_tokens=12, seed=3)
    completions = loop.run(engine.generate_batch(PROMPTS, params))
    assert all(c.token_versions == [1] * len(c.token_ids) for c in completions)
    batch = make_batch(
        prompt_ids=PROMPTS, response_ids=[c.token_ids for c in completions], n=2, pad_token_id=0
    )
    batch.meta["temperature"] = 0.7
    mask = batch["response_mask"].bool()
    got = engine_log_probs(completions, batch["response_mask"].float())
    expected = actor.compute_log_prob(batch)["log_probs"]
    difference = (got - expected).abs()[mask]
    assert difference.max().item() < LOG_PROB_TOLERANCE, difference.max().item()
    # the adapter is applied: the base model alone gives other log-probs
    base = actor.compute_ref_log_prob(batch)["log_probs"]
    assert (got - base).abs()[mask].max().item() > 100 * LOG_PROB_TOLERANCE

    # what trainer.verify_weight_sync compares: the factors as vLLM's adapter holds them
    trainer = {name: weight_fingerprint(t, torch.float32) for name, t in actor.named_weights()}
    held = loop.run(engine.weight_fingerprints(list(trainer)))
    assert set(held) == set(trainer)
    assert {n: fingerprint_difference(trainer[n], held[n]) for n in held} == dict.fromkeys(held)


def merged_model(backend: FSDP2Backend, folder: Path) -> Any:
    """A Hugging Face model holding the backend's merged weights (what a merged sync sends)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.load_state_dict(dict(backend._merged_weights()), strict=False)
    return model


def test_a_second_adapter_sync_changes_generation_to_the_new_adapters(
    loop, engine, actor, tiny_model_dir
):
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    tokens = {}
    for version, seed in ((2, 2), (3, 3)):
        draw_adapters(actor, seed=seed)
        push(loop, engine, actor, version=version)
        completions = loop.run(engine.generate_batch(PROMPTS, greedy))
        model = merged_model(actor, tiny_model_dir)
        eos = stop_ids(model)
        for prompt, completion in zip(PROMPTS, completions, strict=True):
            ids = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            assert completion.token_ids == ids[0, len(prompt) :].tolist()
            assert completion.token_versions == [version] * len(completion.token_ids)
        tokens[version] = [c.token_ids for c in completions]
    assert tokens[2] != tokens[3]
