"""The hf engine split over two ranks (two gloo processes, the second started by the engine):
what it samples, its log-probs, its scores, weight updates and fingerprints equal the whole
model's.
The engine over two Ray nodes is tests/e2e/test_launch_slurm.py."""

from __future__ import annotations

import asyncio
import os
import pickle
import sys

import pytest
import torch
import torch.multiprocessing as mp

from plugrl.errors import PluginError
from plugrl_hf.tensor_parallel import tensor_parallel_unsupported
from tests.plugins.rollout.hf.test_hf_engine import (
    chat_prompts,
    make_engine,
    perturbed_state,
    push,
    request,
)

ATOL = 1e-5
RTOL = 1e-5
"""The split model sums each row-parallel product in two parts: fp32 rounding a few units in
the last place of a log-prob (the largest gap seen, 1.2e-5, on log-probs down to -6.7), where
the whole model's lean and plain forward passes agree exactly."""


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
                torch.tensor(ours.log_probs), torch.tensor(theirs.log_probs), atol=ATOL, rtol=RTOL
            )
    torch.testing.assert_close(
        torch.tensor(sharded["score"]), torch.tensor(whole["score"]), atol=ATOL, rtol=RTOL
    )
    # the split weights gathered from both ranks are the pushed ones, exactly
    assert sharded["fingerprints"] == whole["fingerprints"]
    assert len(whole["fingerprints"]) == 2


def _split_session(model_dir: str, out: str) -> None:
    """In a process of its own (the engine's group is its process's torch.distributed
    group): an engine split over two ranks, its second rank a process it starts itself;
    what it gives goes to the file ``out``."""
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    split = make_engine(
        model_dir, tokenizer, max_num_seqs=8, tensor_model_parallel_size=2, cluster="ray"
    )
    processes = list(split._processes)
    facts = {
        "alive": [p.is_alive() for p in processes],
        "q_rows": split.model.model.layers[0].self_attn.q_proj.weight.shape[0],
        "lean": split._batch.kv.lean is not None,
    }
    weights = perturbed_state(_whole_model(model_dir))
    facts["session"] = asyncio.run(_session(split, chat_prompts(tokenizer)[:3], weights, 1))
    split.close()
    facts["exitcodes"] = [p.exitcode for p in processes]
    with open(out, "wb") as file:
        pickle.dump(facts, file)
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads may abort the process at interpreter exit: a process that got here passed
    os._exit(0)


def _whole_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def test_the_engine_split_over_two_ranks_samples_what_the_whole_model_samples(
    tiny_model_dir, tokenizer, tmp_path
):
    out = tmp_path / "split.pkl"
    process = mp.get_context("spawn").Process(
        target=_split_session, args=(str(tiny_model_dir), str(out))
    )
    process.start()
    # meanwhile, the whole model in this process, through the same forward (no lean path)
    # and with one thread as the split ranks (the CPU kernels' sums then split alike)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=8, lean_decode=False)
        weights = perturbed_state(_whole_model(str(tiny_model_dir)))
        whole = asyncio.run(_session(engine, chat_prompts(tokenizer)[:3], weights, 1))
        engine.close()
    finally:
        torch.set_num_threads(threads)
    process.join(timeout=300)
    if process.is_alive():
        process.kill()
        pytest.fail("the split engine did not end in 300 s")
    assert process.exitcode == 0, "the split engine failed: its traceback is above"
    with open(out, "rb") as file:
        facts = pickle.load(file)
    assert facts["alive"] == [True]  # its second rank, started by the engine
    assert facts["q_rows"] * 2 == weights["model.layers.0.self_attn.q_proj.weight"].shape[0]
    assert not facts["lean"]  # the split model runs its own forward
    assert facts["exitcodes"] == [0]  # the second rank returned when the group closed
    _assert_same(facts["session"], whole)


def test_a_model_whose_heads_do_not_divide_is_refused(model):
    assert tensor_parallel_unsupported(model, 2) is None
    assert "4 attention and 2 key-value heads do not divide by 3" in (
        tensor_parallel_unsupported(model, 3) or ""
    )
    from plugrl_hf.tensor_parallel import shard_model

    with pytest.raises(PluginError, match=r"rollout\.tensor_model_parallel_size=3"):
        shard_model(model, 0, 3, None)


def test_in_the_process_it_shares_with_the_trainer_the_engine_keeps_the_whole_model(
    tiny_model_dir, tokenizer, model, caplog
):
    with caplog.at_level("INFO", logger="plugrl.rollout.hf"):
        engine = make_engine(tiny_model_dir, tokenizer, tensor_model_parallel_size=2)
    assert engine._processes == [] and engine._shards is None
    whole = model.model.layers[0].self_attn.q_proj.weight.shape
    assert engine.model.model.layers[0].self_attn.q_proj.weight.shape == whole
    assert "shares with the trainer (cluster.mode=local)" in caplog.text
    engine.close()
