"""A smoke test for a machine with vLLM and its accelerator: a two-step GRPO run of the
quickstart with ``rollout.engine: vllm``, then the engine alone against Hugging Face on the
same device. Prints the figures of each step and one PASS/FAIL line per check; exits 1 when a
check fails.

    python -m plugrl_vllm.smoke [--device auto] [--out runs/vllm-smoke] [--assets DIR]
        [--checks run,engine,lora] [KEY=VALUE ...]

Checks: the run completes its steps, pushing the trainer's weights to the engine each step
(``perf/weight_sync_megabytes``); a vLLM engine on the quickstart model gives the greedy
tokens of Hugging Face's ``generate`` on the same device, and log-probs of its sampled tokens
within ``--max-logprob-diff`` of the model's own (temperature-scaled, teacher-forced); after
an adapter-only sync (``rollout.lora_sync=adapters``) of a rank-32 fsdp2 LoRA actor with
random adapters, the engine's log-probs of its sampled tokens are within the same limit of the
actor's and away from the base model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = 8
MAX_TOKENS = 16


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_steps(args: argparse.Namespace, paths: Any, run_dir: Path) -> list[tuple[bool, str]]:
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import run_recipe
    from plugrl_tools.quickstart import quickstart_overrides

    plugins = get_plugin_manager()  # a script's edge: the process's plugins
    recipe = load_recipe(
        "quickstart",
        [
            *quickstart_overrides(paths),
            f"device.name={args.device}",
            "rollout.engine=vllm",
            f"trainer.total_training_steps={args.steps}",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.export_hf=false",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
            *args.overrides,
        ],
        plugins,
    )
    results = []
    started = time.perf_counter()
    try:
        run_recipe(recipe, plugins)
        results.append((True, f"GRPO run finished in {time.perf_counter() - started:.1f} s"))
    except Exception as error:
        results.append((False, f"GRPO run failed: {type(error).__name__}: {error}"))
    records = [record for record in _records(run_dir) if "actor/pg_loss" in record]
    for record in records:
        figures = {
            key: round(value, 4)
            for key, value in record.items()
            if key.startswith(("critic/score/mean", "response_length/mean", "timing_s/", "perf/"))
            and isinstance(value, float)
        }
        print(f"step {record['step']}: {json.dumps(figures)}")
    synced = [record.get("perf/weight_sync_megabytes", 0) for record in records]
    results.append(
        (
            len(records) == args.steps and all(megabytes > 0 for megabytes in synced),
            f"{len(records)} of {args.steps} steps, weights pushed each step ({synced} MiB)",
        )
    )
    return results


def check_engine(args: argparse.Namespace, paths: Any) -> list[tuple[bool, str]]:
    """The engine alone on the quickstart model against Hugging Face on the same device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from plugrl.cluster.worker import build_device
    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import SamplingParams
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import resolve_device_name
    from plugrl_vllm.engine import VLLMRolloutEngine

    plugins = get_plugin_manager()
    recipe = load_recipe(
        "quickstart",
        [
            f"model.path={paths.model_path}",
            "model.dtype=float32",
            # the reference is the float32 module: the engine samples in float32 too
            "rollout.dtype=float32",
            f"device.name={args.device}",
            "rollout.engine=vllm",
            "rollout.gpu_memory_utilization=0.3",
        ],
        plugins,
    )
    device = build_device(plugins, resolve_device_name(recipe, plugins), recipe)
    device.set_device(0)
    torch_device = device.torch_device()
    tokenizer = AutoTokenizer.from_pretrained(paths.model_path)
    prompts = [list(tokenizer(f"{a} + {a + 7} =")["input_ids"]) for a in range(PROMPTS)]
    engine = VLLMRolloutEngine(
        recipe.rollout, PartContext(recipe=recipe, device=device, tokenizer=tokenizer)
    )
    model = AutoModelForCausalLM.from_pretrained(paths.model_path, dtype=torch.float32)
    model = model.to(torch_device).eval()
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    results = []
    try:
        greedy = asyncio.run(
            engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
        )
        same = 0
        for prompt, completion in zip(prompts, greedy, strict=True):
            ids = torch.tensor([prompt], device=torch_device)
            out = model.generate(
                ids,
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            same += out[0, len(prompt) :].tolist() == completion.token_ids
        results.append(
            (same == len(prompts), f"greedy tokens equal Hugging Face's on {same}/{len(prompts)}")
        )
        temperature = 0.8
        sampled = asyncio.run(
            engine.generate_batch(
                prompts, SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, seed=1)
            )
        )
        worst = 0.0
        with torch.no_grad():
            for prompt, completion in zip(prompts, sampled, strict=True):
                if not completion.token_ids:
                    continue
                ids = torch.tensor([[*prompt, *completion.token_ids]], device=torch_device)
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
                expected = torch.log_softmax(logits, dim=-1).gather(
                    -1, torch.tensor(completion.token_ids, device=torch_device)[:, None]
                )[:, 0]
                got = torch.tensor(completion.log_probs, device=torch_device)
                worst = max(worst, (got - expected).abs().max().item())
        results.append(
            (
                worst <= args.max_logprob_diff,
                f"log-probs of sampled tokens vs the model's: largest |diff| {worst:.2e} "
                f"(limit {args.max_logprob_diff})",
            )
        )
    finally:
        engine.close()
    return results


def check_adapter_sync(args: argparse.Namespace, paths: Any) -> list[tuple[bool, str]]:
    """A rank-32 fsdp2 LoRA actor with random adapters sends them alone to a vLLM engine that
    keeps the quickstart model as its base; the engine's log-probs against the actor's."""
    import torch
    from transformers import AutoTokenizer

    from plugrl.cluster.distributed import ensure_process_group
    from plugrl.cluster.worker import build_backend, build_device
    from plugrl.parts.context import DistInfo, PartContext
    from plugrl.parts.rollout import SamplingParams
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import resolve_device_name
    from plugrl.testing import make_batch
    from plugrl_vllm.engine import VLLMRolloutEngine

    plugins = get_plugin_manager()
    recipe = load_recipe(
        "quickstart",
        [
            f"model.path={paths.model_path}",
            "model.dtype=float32",
            "rollout.dtype=float32",
            "model.lora_rank=32",
            "model.lora_alpha=64",
            "rollout.lora_sync=adapters",
            f"device.name={args.device}",
            "rollout.engine=vllm",
            "rollout.gpu_memory_utilization=0.3",
            "actor.ppo_mini_batch_size=8",
        ],
        plugins,
    )
    device = build_device(plugins, resolve_device_name(recipe, plugins), recipe)
    device.set_device(0)
    tokenizer = AutoTokenizer.from_pretrained(paths.model_path)
    prompts = [list(tokenizer(f"{a} + {a + 7} =")["input_ids"]) for a in range(PROMPTS)]
    # the fsdp2 backend (actor.backend), one rank, as a worker builds it
    ensure_process_group(device, DistInfo())
    actor: Any = build_backend(recipe, "actor", device, DistInfo(), plugins)
    actor.setup(1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in actor.model.named_parameters():
            if ".lora_" in name:
                local = parameter.to_local()
                local.copy_(torch.randn(local.shape, generator=generator) * 0.05)
    engine = VLLMRolloutEngine(
        recipe.rollout, PartContext(recipe=recipe, device=device, tokenizer=tokenizer)
    )
    results = []
    try:

        async def push() -> float:
            start = time.perf_counter()
            await engine.begin_weight_update(1, actor.weight_metadata())
            for bucket in actor.weight_buckets(512 * 2**20):
                await engine.load_weights(bucket)
            await engine.finish_weight_update()
            return time.perf_counter() - start

        seconds = asyncio.run(push())
        megabytes = sum(meta.nbytes for meta in actor.weight_metadata()) / 2**20
        temperature = 0.8
        sampled = asyncio.run(
            engine.generate_batch(
                prompts, SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, seed=1)
            )
        )
        batch = make_batch(
            prompt_ids=prompts,
            response_ids=[completion.token_ids for completion in sampled],
            n=1,
            pad_token_id=0,
        )
        batch.meta["temperature"] = temperature
        mask = batch["response_mask"].bool()
        got = torch.zeros(mask.shape)
        for row, completion in enumerate(sampled):
            got[row, : len(completion.log_probs)] = torch.tensor(completion.log_probs)
        expected = actor.compute_log_prob(batch)["log_probs"].float().cpu()
        base = actor.compute_ref_log_prob(batch)["log_probs"].float().cpu()
        worst = (got - expected).abs()[mask].max().item()
        from_base = (got - base).abs()[mask].max().item()
        results.append(
            (
                worst <= args.max_logprob_diff < from_base,
                f"after an adapter-only sync ({megabytes:.2f} MiB in {seconds:.3f} s): log-probs "
                f"vs the LoRA actor's: largest |diff| {worst:.2e} (limit "
                f"{args.max_logprob_diff}); vs the base model's {from_base:.2e}",
            )
        )
    finally:
        engine.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="device.name of the run")
    parser.add_argument("--out", default="runs/vllm-smoke", help="folder of the assets and run")
    parser.add_argument(
        "--assets", default=None, help="quickstart folder to use (default: OUT/assets, built once)"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-logprob-diff", type=float, default=1e-3)
    parser.add_argument("--checks", default="run,engine,lora", help="which checks to run")
    parser.add_argument("overrides", nargs="*", help="more recipe overrides (KEY=VALUE)")
    args = parser.parse_args(argv)

    from plugrl_tools.quickstart import prepare_quickstart

    out = Path(args.out)
    paths = prepare_quickstart(args.assets or out / "assets")
    checks = set(args.checks.split(","))
    results = run_steps(args, paths, out / "run") if "run" in checks else []
    for name, check in (("engine", check_engine), ("lora", check_adapter_sync)):
        if name not in checks:
            continue
        try:
            results += check(args, paths)
        except Exception as error:
            results.append((False, f"{name} check failed: {type(error).__name__}: {error}"))
    for ok, line in results:
        print(f"{'PASS' if ok else 'FAIL'}: {line}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
