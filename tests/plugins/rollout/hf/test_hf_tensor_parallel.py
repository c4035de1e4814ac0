"""The hf engine split over two ranks (two gloo processes): what it samples, its log-probs,
its scores, weight updates and fingerprints equal the whole model's in the same process.
The engine over two Ray nodes is tests/e2e/test_launch_slurm.py."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import torch
import torch.multiprocessing as mp

from plugrl.errors import PluginError
from plugrl_hf.tensor_parallel import TensorParallelWorker, free_port, tensor_parallel_unsupported
from tests.plugins.rollout.hf.test_hf_engine import (
    chat_prompts,
    make_engine,
    perturbed_state,
    push,
    request,
)

ATOL = 1e-5


async def _generate(engine, prompts) -> list:
    """Greedy rows of several lengths (they leave the batch at different steps) beside one
    sampled request of three seeded samples."""
    requests = [
        request(f"g{i}", prompt, temperature=0.0, max_tokens=max_tokens)
        for i, (prompt, max_tokens) in enumerate(zip(prompts, (12, 5, 9), strict=True))
    ]
    requests.append(request("s", prompts[0], temperature=1.0, max_tokens=10, n=3, seed=7))
    results = await asyncio.gather(*(engine.generate_request(r) for r in requests))
    return [c for completions in results for c in completions]


async def _session(engine, prompts, weights, version) -> dict:
    """What the tests compare: completions before and after a weight update, a score and
    the fingerprints of a split and a whole weight."""
    first = await _generate(engine, prompts)
    score = await engine.score_tokens(prompts[1], first[1].token_ids)
    await push(engine, weights, version)
    second = await _generate(engine, prompts)
    names = ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    fingerprints = await engine.weight_fingerprints(names)
    return {"first": first, "score": score, "second": second, "fingerprints": fingerprints}


def _assert_same(sharded: dict, whole: dict) -> None:
    for key in ("first", "second"):
        assert len(sharded[key]) == len(whole[key])
        for ours, theirs in zip(sharded[key], whole[key], strict=True):
            assert ours.token_ids == theirs.token_ids, key
            assert ours.finish_reason == theirs.finish_reason
            torch.testing.assert_close(
                torch.tensor(ours.log_probs), torch.tensor(theirs.log_probs), atol=ATOL, rtol=0
            )
    torch.testing.assert_close(
        torch.tensor(sharded["score"]), torch.tensor(whole["score"]), atol=ATOL, rtol=0
    )
    # the split weights gathered from both ranks are the pushed ones, exactly
    assert sharded["fingerprints"] == whole["fingerprints"]
    assert len(whole["fingerprints"]) == 2


def _rank(rank: int, port: int, model_dir: str) -> None:
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config_engine = make_engine(model_dir, tokenizer, max_num_seqs=8) if rank == 0 else None
    if rank == 1:
        from plugrl.recipe import ModelConfig, Recipe
        from plugrl_hf.config import HFRolloutConfig

        config = HFRolloutConfig(max_num_seqs=8)
        recipe = Recipe(model=ModelConfig(path=model_dir, dtype="float32"), rollout=config)
        pad = tokenizer.pad_token_id
        worker = TensorParallelWorker(
            recipe, 1, 2, "cpu", "gloo", config, torch.float32, pad or tokenizer.eos_token_id
        )
        worker.run("127.0.0.1", port)
    else:
        engine = config_engine
        prompts = chat_prompts(tokenizer)[:3]
        original = {k: v.clone() for k, v in engine.model.state_dict().items()}
        weights = perturbed_state(engine.model)
        # the whole model (on its lean decode path), then back to the first weights
        whole = asyncio.run(_session(engine, prompts, weights, 1))
        asyncio.run(push(engine, original, 2))
        engine.join_tensor_parallel("127.0.0.1", port, 2)
        layer = engine.model.model.layers[0]
        assert (
            layer.self_attn.q_proj.weight.shape[0] * 2
            == original["model.layers.0.self_attn.q_proj.weight"].shape[0]
        )
        assert engine._batch.kv.lean is None  # the split model runs its own forward
        sharded = asyncio.run(_session(engine, prompts, weights, 3))
        _assert_same(sharded, whole)
        engine.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads may abort the process at interpreter exit: a rank that got here passed
    os._exit(0)


def test_the_engine_split_over_two_ranks_samples_what_the_whole_model_samples(tiny_model_dir):
    mp.spawn(_rank, args=(free_port(), str(tiny_model_dir)), nprocs=2, join=True)


def test_a_model_whose_heads_do_not_divide_is_refused(model):
    assert tensor_parallel_unsupported(model, 2) is None
    assert "4 attention and 2 key-value heads do not divide by 3" in (
        tensor_parallel_unsupported(model, 3) or ""
    )
    from plugrl_hf.tensor_parallel import shard_model

    with pytest.raises(PluginError, match=r"rollout\.tensor_model_parallel_size=3"):
        shard_model(model, 0, 3, None)
