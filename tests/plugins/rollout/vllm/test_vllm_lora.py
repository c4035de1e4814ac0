"""Adapter-only weight sync (``rollout.lora_sync=adapters``) into vLLM's CPU build: the fsdp2
LoRA actor sends its adapters' factors alone, the engine keeps the base it loaded and applies
the latest adapter to every request.

Runs where vLLM is installed (``plugins/rollout/vllm/test-env.sh``); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from plugrl.parts.context import DistInfo, PartContext
from plugrl.parts.rollout import (
    GenerationRequest,
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
from plugrl_vllm.logs import LORA_TOKENIZER_NOTICE

from .test_vllm_engine import LOG_PROB_TOLERANCE, PROMPTS, Loop, _until_tokens, hf_greedy

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
        rollout=VLLMRolloutConfig(engine="vllm", lora_sync="adapters"),
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


def test_log_probs_after_an_adapter_sync_match_the_trainers(loop, engine, actor, caplog):
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
    # vLLM's notice at the first request naming an adapter says nothing to a plugrl user
    assert not [r for r in caplog.records if r.getMessage().startswith(LORA_TOKENIZER_NOTICE)]
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


def greedy_matches_hugging_face(loop, engine, model, version: int) -> list[list[int]]:
    """The engine's greedy tokens for every prompt, checked against ``model``'s."""
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    completions = loop.run(engine.generate_batch(PROMPTS, greedy))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.token_ids == hf_greedy(model, prompt, 10)
        assert completion.token_versions == [version] * len(completion.token_ids)
    return [completion.token_ids for completion in completions]


def test_a_new_adapter_changes_generation_requests_kept_across_the_sync_included(
    loop, engine, actor, tiny_model_dir
):
    draw_adapters(actor, seed=2)
    push(loop, engine, actor, version=2)
    before_sync = greedy_matches_hugging_face(
        loop, engine, merged_model(actor, tiny_model_dir), version=2
    )

    # a request paused (kept) across the next sync continues with the new adapter
    request = GenerationRequest(
        request_id="kept",
        prompt_ids=PROMPTS[2],
        params=SamplingParams(n=1, temperature=0.0, max_tokens=14),
    )
    kept_at: list[int] = []

    async def start() -> Any:
        task = asyncio.ensure_future(engine.generate_request(request))
        await _until_tokens(engine, "kept", 4)
        await engine.pause("keep")
        kept_at.append(len(engine._by_request["kept"][0].token_ids))
        return task

    task = loop.run(start())
    draw_adapters(actor, seed=3)
    push(loop, engine, actor, version=3)
    loop.run(engine.resume())
    (kept,) = loop.run(task)
    model = merged_model(actor, tiny_model_dir)
    before = kept_at[0]
    assert len(kept.token_ids) > before, "the request ended before the sync"
    assert kept.token_versions == [2] * before + [3] * (len(kept.token_ids) - before)
    continued = hf_greedy(model, [*PROMPTS[2], *kept.token_ids[:before]], 14 - before)
    assert kept.token_ids[before:] == continued[: len(kept.token_ids) - before]

    assert greedy_matches_hugging_face(loop, engine, model, version=3) != before_sync
