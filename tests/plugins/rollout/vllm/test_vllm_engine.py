"""The vllm engine for real, on vLLM's CPU build: log-probs against the fsdp2 backend's,
greedy tokens against Hugging Face's after weight pushes, abort, pause keeping requests across
a weight update, and a GRPO run with ``rollout.engine: vllm``.

Runs where vLLM is installed (``plugins/rollout/vllm/test-env.sh`` builds that environment);
skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from plugrl.errors import PluginError, RecipeError
from plugrl.parts.rollout import GenerationRequest, SamplingParams, WeightMeta
from plugrl.recipe import DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl.testing import make_batch, part_context
from plugrl_cpu.device import CpuDevice
from plugrl_vllm.config import VLLMRolloutConfig
from plugrl_vllm.engine import VLLMRolloutEngine

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [40, 41, 42, 43, 44, 45], [100, 3]]
# vLLM's float32 CPU kernels against the trainer's forward of the same weights: measured
# differences are at most 3e-5
LOG_PROB_TOLERANCE = 1e-4


class Loop:
    """One event loop for the module's engine (an engine lives on one loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)


@pytest.fixture(scope="module")
def loop():
    runner = Loop()
    yield runner
    runner.loop.close()


@pytest.fixture(scope="module")
def recipe(tiny_model_dir: Path) -> Recipe:
    return Recipe(
        model=ModelConfig(path=str(tiny_model_dir), dtype="float32"),
        data=DataConfig(max_prompt_length=32, max_response_length=64),
        trainer=TrainerConfig(seed=5),
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def engine(loop: Loop, recipe: Recipe, tokenizer: Any):
    async def build() -> VLLMRolloutEngine:
        context = part_context(recipe, device=CpuDevice(), tokenizer=tokenizer)
        return VLLMRolloutEngine(VLLMRolloutConfig(), context)

    built = loop.run(build())
    yield built
    built.close()


def hf_model(folder: Path, seed: int | None = None) -> Any:
    """The folder's model; with ``seed``, its matrices drawn anew (other weights to push)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, 0.15, generator=generator)
    return model


def push(loop: Loop, engine: VLLMRolloutEngine, model: Any, version: int, per_bucket: int = 3):
    """Push every weight of ``model`` in buckets of ``per_bucket`` tensors, as a transport
    does: each bucket's tensors are reused (overwritten) once the call returns."""
    weights = list(model.state_dict().items())
    metas = [WeightMeta(name, tensor.shape, "float32") for name, tensor in weights]

    async def run() -> None:
        await engine.begin_weight_update(version, metas)
        for start in range(0, len(weights), per_bucket):
            bucket = [
                (name, tensor.clone()) for name, tensor in weights[start : start + per_bucket]
            ]
            await engine.load_weights(bucket)
            for _, tensor in bucket:
                tensor.fill_(float("nan"))
        await engine.finish_weight_update()

    loop.run(run())


def stop_ids(model: Any) -> list[int]:
    """The ids the model's generation config stops at (vLLM reads the same file)."""
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def hf_greedy(model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    eos = stop_ids(model)
    ids = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )
    return ids[0, len(prompt) :].tolist()


def test_vllm_logs_warnings_and_errors_only_by_default(engine):
    import logging

    assert logging.getLogger("vllm").getEffectiveLevel() == logging.WARNING
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"


def test_an_unknown_engine_argument_is_named(recipe, tokenizer):
    config = VLLMRolloutConfig(engine_kwargs={"enable_prefix_caching": True, "no_such_argument": 2})
    with pytest.raises(RecipeError) as error:
        VLLMRolloutEngine(config, part_context(recipe, device=CpuDevice(), tokenizer=tokenizer))
    assert str(error.value) == (
        "rollout.engine_kwargs: no_such_argument is not an argument of vLLM's engine "
        "(EngineArgs of vLLM 0.32.0); remove it or fix its name"
    )


def test_log_probs_match_the_fsdp2_backend_on_the_same_tokens(loop, engine, tiny_model_dir):
    from plugrl.recipe import ClusterConfig
    from plugrl_fsdp2.backend import FSDP2Backend
    from plugrl_fsdp2.config import FSDP2ActorConfig

    push(loop, engine, hf_model(tiny_model_dir), version=1)
    params = SamplingParams(n=2, temperature=0.7, max_tokens=12, seed=3)
    completions = loop.run(engine.generate_batch(PROMPTS, params))
    assert any(len(c.token_ids) == 12 for c in completions)
    batch = make_batch(
        prompt_ids=PROMPTS, response_ids=[c.token_ids for c in completions], n=2, pad_token_id=0
    )
    batch.meta["temperature"] = 0.7
    trainer_recipe = Recipe(
        model=ModelConfig(path=str(tiny_model_dir), dtype="float32"),
        actor=FSDP2ActorConfig(ppo_mini_batch_size=8),
        cluster=ClusterConfig(mode="local", num_cpus=2),
    )
    from plugrl.parts.context import DistInfo, PartContext

    backend = FSDP2Backend(
        trainer_recipe.actor,
        PartContext(recipe=trainer_recipe, role="actor", device=CpuDevice(), dist=DistInfo()),
    )
    backend.setup(1)
    expected = backend.compute_log_prob(batch)["log_probs"]
    mask = batch["response_mask"].bool()
    got = torch.zeros_like(expected)
    for row, completion in enumerate(completions):
        got[row, : len(completion.log_probs)] = torch.tensor(completion.log_probs)
    difference = (got - expected).abs()[mask]
    assert difference.max().item() < LOG_PROB_TOLERANCE, difference.max().item()


def test_scored_tokens_get_the_unscaled_models_log_probs(loop, engine, tiny_model_dir):
    """A distillation teacher's scores (prompt_logprobs): the model's own log-probs of given
    tokens, at temperature 1 whatever they were sampled with."""
    model = hf_model(tiny_model_dir, seed=21)
    push(loop, engine, model, version=9)
    params = SamplingParams(n=1, temperature=0.7, max_tokens=8, seed=4)
    completions = loop.run(engine.generate_batch(PROMPTS, params))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        scored = loop.run(engine.score_tokens(prompt, completion.token_ids))
        ids = torch.tensor([[*prompt, *completion.token_ids]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        targets = torch.tensor(completion.token_ids)[:, None]
        expected = torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1)
        assert scored == pytest.approx(expected.tolist(), abs=LOG_PROB_TOLERANCE)
    assert loop.run(engine.score_tokens(PROMPTS[0], [])) == []


def test_greedy_tokens_equal_hugging_face_after_each_weight_push(loop, engine, tiny_model_dir):
    for version, seed in ((2, 11), (3, 12)):
        model = hf_model(tiny_model_dir, seed=seed)
        push(loop, engine, model, version=version, per_bucket=version)
        completions = loop.run(
            engine.generate_batch(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10))
        )
        for prompt, completion in zip(PROMPTS, completions, strict=True):
            assert completion.token_ids == hf_greedy(model, prompt, 10)
            assert completion.token_versions == [version] * len(completion.token_ids)


def test_weights_read_back_are_the_pushed_ones_fused_layers_included(loop, engine, tiny_model_dir):
    from plugrl.parts.rollout import fingerprint_difference, weight_fingerprint

    pushed = hf_model(tiny_model_dir, seed=21)
    push(loop, engine, pushed, version=7)
    names = list(pushed.state_dict())
    held = loop.run(engine.weight_fingerprints(names))
    # vLLM's CPU build packs its linear layers for its kernels (the parameters left empty):
    # what stays readable is the embeddings, the norms and the biases of the fused q/k/v layer
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(held)
    biases = [f"model.layers.0.self_attn.{shard}_proj.bias" for shard in "qkv"]
    assert set(biases) <= set(held)
    expected = {n: weight_fingerprint(t, torch.float32) for n, t in pushed.state_dict().items()}
    assert {n: fingerprint_difference(expected[n], held[n]) for n in held} == dict.fromkeys(held)
    # each shard of the fused layer is read from its own rows: other values differ
    other = hf_model(tiny_model_dir, seed=22).state_dict()
    for name in biases:
        changed = weight_fingerprint(other[name] + 1.0)
        assert fingerprint_difference(changed, held[name]) is not None
        assert fingerprint_difference(expected[name], held[name]) is None


def test_an_incomplete_weight_update_is_refused(loop, engine, tiny_model_dir):
    weights = hf_model(tiny_model_dir).state_dict()
    metas = [WeightMeta(name, t.shape, "float32") for name, t in weights.items()]

    async def announce_too_few() -> None:
        await engine.begin_weight_update(9, metas[:-3])

    with pytest.raises(PluginError, match="push every weight with each version"):
        loop.run(announce_too_few())

    async def send_too_few() -> None:
        await engine.begin_weight_update(9, metas)
        await engine.load_weights(list(weights.items())[:5])
        await engine.finish_weight_update()

    with pytest.raises(PluginError, match=r"finish_weight_update: 5 of \d+ announced weights"):
        loop.run(send_too_few())
    with pytest.raises(RuntimeError, match="load new weights"):
        loop.run(engine.generate_batch(PROMPTS[:1], SamplingParams(max_tokens=2)))
    push(loop, engine, hf_model(tiny_model_dir), version=4)


def test_the_model_load_weights_route_fails_on_cpu(engine, tiny_model_dir):
    """Why the cpu device's route is reload_weights: vLLM's CPU build repacks linear weights
    after loading, and the model's own load_weights cannot load into them."""
    weights = list(hf_model(tiny_model_dir).state_dict().items())
    with pytest.raises(Exception, match="weight_loader"):
        engine.llm.collective_rpc("plugrl_load_weights", args=("load_weights", weights))


def test_seeded_samples_repeat_and_differ_from_each_other(loop, engine):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=42)
    first = loop.run(engine.generate_batch(PROMPTS[:1], params))
    again = loop.run(engine.generate_batch(PROMPTS[:1], params))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1


def test_stop_token_ids_end_a_response(loop, engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    (free,) = loop.run(engine.generate_batch(PROMPTS[:1], greedy))
    stop = free.token_ids[3]
    cut = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop])
    (stopped,) = loop.run(engine.generate_batch(PROMPTS[:1], cut))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]


async def _until_tokens(engine: VLLMRolloutEngine, request_id: str, count: int) -> None:
    """Wait until every sample of ``request_id`` has at least ``count`` tokens."""
    while True:
        samples = engine._by_request.get(request_id, [])
        if samples and all(len(s.token_ids) >= count for s in samples):
            return
        await asyncio.sleep(0.005)


def test_abort_returns_the_tokens_so_far(loop, engine):
    request = GenerationRequest(
        request_id="to-abort",
        prompt_ids=PROMPTS[0],
        params=SamplingParams(n=2, temperature=1.0, max_tokens=60, seed=1),
    )

    async def run():
        task = asyncio.ensure_future(engine.generate_request(request))
        await _until_tokens(engine, "to-abort", 3)
        await engine.abort(["to-abort"])
        return await task

    completions = loop.run(run())
    for completion in completions:
        assert completion.finish_reason == "aborted"
        assert 3 <= len(completion.token_ids) < 60
        assert len(completion.log_probs) == len(completion.token_ids)
    assert not engine._samples


def test_pause_abort_ends_requests_in_flight(loop, engine):
    request = GenerationRequest(
        request_id="paused-away",
        prompt_ids=PROMPTS[1],
        params=SamplingParams(n=1, temperature=1.0, max_tokens=60, seed=2),
    )

    async def run():
        task = asyncio.ensure_future(engine.generate_request(request))
        await _until_tokens(engine, "paused-away", 2)
        await engine.pause("abort")
        completions = await task
        await engine.resume()
        return completions

    (completion,) = loop.run(run())
    assert completion.finish_reason == "aborted"
    assert len(completion.token_ids) >= 2


def test_pause_keep_then_a_weight_push_continues_requests_with_the_new_weights(
    loop, engine, tiny_model_dir
):
    """Tokens before the push carry the old version, tokens after it the new one, and the
    tokens after it are what the new weights give greedily for the prompt and the tokens so
    far (the request's keys and values are computed again)."""
    old_version = engine.weight_version
    new_model = hf_model(tiny_model_dir, seed=21)
    request = GenerationRequest(
        request_id="kept",
        prompt_ids=PROMPTS[2],
        params=SamplingParams(n=1, temperature=0.0, max_tokens=14),
    )
    kept_at: list[int] = []

    async def run():
        task = asyncio.ensure_future(engine.generate_request(request))
        await _until_tokens(engine, "kept", 4)
        await engine.pause("keep")
        kept_at.append(len(engine._by_request["kept"][0].token_ids))
        return task

    task = loop.run(run())
    push(loop, engine, new_model, version=old_version + 1)
    loop.run(engine.resume())
    (completion,) = loop.run(task)
    before = kept_at[0]
    assert completion.token_versions == (
        [old_version] * before + [old_version + 1] * (len(completion.token_ids) - before)
    )
    assert len(completion.token_ids) > before, "the request ended before the push"
    continued = hf_greedy(
        new_model,
        [*PROMPTS[2], *completion.token_ids[:before]],
        len(completion.token_ids) - before,
    )
    assert completion.token_ids[before:] == continued


# --------------------------------------------------------------------------------------------
# A GRPO run with rollout.engine: vllm
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_grpo_run_with_the_vllm_engine(tmp_path):
    import yaml

    from plugrl_tools.quickstart.untrained import build_untrained_task

    task = build_untrained_task(tmp_path / "task")
    run_dir = tmp_path / "run"
    recipe = {
        **task.recipe_sections(max_response_length=8),
        "device": "cpu",
        "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}},
        "rollout": {"engine": "vllm", "n": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "total_training_steps": 2,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "seed": 7,
            "test_freq": 2,
        },
        "cluster": "local",
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # vLLM's start-up lines are not shown unless asked for (rollout.engine_log_level)
    for noise in ("Loading safetensors checkpoint shards", "reduce_op", "Triton not available"):
        assert noise not in result.stderr, result.stderr
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    steps = [r for r in records if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["perf/weight_sync_megabytes"] > 0 for r in steps)
    assert any("val-core/" in key for r in records for key in r)


def test_the_gsm8k_recipe_with_vllm_validates(tmp_path):
    recipe = Path(__file__).resolve().parents[4] / (
        "plugins/rollout/vllm/recipes/gsm8k-grpo-qwen2.5-0.5b-vllm.yaml"
    )
    result = subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", "run", str(recipe), "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    import yaml

    printed = yaml.safe_load(result.stdout)
    rollout = printed["rollout"]
    assert rollout["engine"] == "vllm"
    assert rollout["enable_chunked_prefill"] is False
    assert rollout["gpu_memory_utilization"] == 0.7
    assert rollout["n"] == 8
    assert printed["algorithm"]["adv_estimator"] == "grpo"
    assert printed["actor"]["use_kl_loss"] is True
