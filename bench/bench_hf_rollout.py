"""The ``hf`` rollout engine against ``model.generate`` on the same prompts and model.

Uses the quickstart's warm-started model (built, or reused, under ``--quickstart-dir``) and its
validation prompts. The engine is colocated (``bind_model``) with the float32 module a trainer
would hold: in float32 it generates with that very module, the one ``generate`` uses; with
``rollout.dtype: bfloat16`` it generates from its own bfloat16 copy of it (as a colocated
engine does), against ``generate`` on a bfloat16 copy. ``--dtype`` picks float32, bfloat16 or
both (the default; their rows side by side). Each case samples at temperature 1 with the same
stop tokens and token limit, alternating the engine and ``model.generate`` ``--repeats`` times
after a warm-up, and prints side by side the best time per call, the response tokens per second
(tokens up to and including the stop token; ``generate``'s padding after it is not counted),
the ratio of the best rates, the median of the per-repeat ratios (each repeat runs both sides
back to back, so a burst of load from other processes hits both) and the ratio of the best
rates per CPU second of this process (time other processes take from it does not count; with
one thread it is what the wall-clock ratio is on an idle machine).

Cases: 64 prompts x 1 sample, and 8 prompts x 8 samples (GRPO-like groups; ``generate`` gets
``num_return_sequences``).

``--profile`` then times calls of each side by phase (prompt passes, decode steps, and the
rest: sampling and bookkeeping; the fastest of three) and lists the engine's costliest torch
operations.

    python bench/bench_hf_rollout.py [--prompts 64] [--max-tokens 32] [--repeats 10]
        [--threads N] [--dtype both|float32|bfloat16] [--model-dir DIR] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from plugrl.data.batch import left_pad
from plugrl.data.dataset import PromptDataset, pad_token_id_of
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import SamplingParams
from plugrl.recipe import DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from plugrl_hf.sampler import default_stop_token_ids
from plugrl_tools.quickstart import DEFAULT_DIR, prepare_quickstart


def generate_tokens(
    model: Any, prompts: list[list[int]], n: int, max_tokens: int, pad: int, stop: list[int]
) -> int:
    """One ``model.generate`` call; returns the response tokens up to each row's stop token."""
    input_ids, mask = left_pad(prompts, pad)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=n,
            eos_token_id=stop,
            pad_token_id=pad,
        )
    total = 0
    for row in output[:, input_ids.shape[1] :].tolist():
        ends = [i for i, token in enumerate(row) if token in stop]
        total += ends[0] + 1 if ends else len(row)
    return total


def alternate(
    repeats: int, runs: dict[str, Callable[[], int]]
) -> dict[str, list[tuple[float, float, int]]]:
    """Run each of ``runs`` in turn, ``repeats`` times: (wall seconds, CPU seconds of this
    process, tokens) per run."""
    timings: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = run()
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu, tokens))
    return timings


def engine_phases(engine: HFRolloutEngine, run: Callable[[], int]) -> dict[str, float]:
    """Seconds of one engine ``run`` in prompt passes, decode steps and the rest (timed
    around the cache's methods: a hook on the model would make the engine run the model's
    own forward)."""
    assert engine._batch is not None
    kv = engine._batch.kv
    spent = {"prompt": 0.0, "decode": 0.0}

    def timed(kind: str, method: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[kind] += time.perf_counter() - start

        return call

    kv.prefill = timed("prompt", kv.prefill)  # type: ignore[method-assign]
    kv.forward_step = timed("decode", kv.forward_step)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
    finally:
        del kv.prefill, kv.forward_step
    return {**spent, "rest": total - spent["prompt"] - spent["decode"], "total": total}


def phases(model: Any, run: Callable[[], int]) -> dict[str, float]:
    """Seconds of one ``model.generate`` ``run`` in prompt passes, decode steps and the rest."""
    spent = {"prompt": 0.0, "decode": 0.0}
    started: list[tuple[str, float]] = []

    def before(module, args, kwargs):
        kind = "decode" if kwargs["input_ids"].shape[1] == 1 else "prompt"
        started.append((kind, time.perf_counter()))

    def after(module, args, kwargs, output):
        kind, start = started.pop()
        spent[kind] += time.perf_counter() - start

    handles = [
        model.register_forward_pre_hook(before, with_kwargs=True),
        model.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
    return {**spent, "rest": total - spent["prompt"] - spent["decode"], "total": total}


def top_operations(run: Callable[[], int], count: int = 8) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run()
    averages = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)
    return ", ".join(
        f"{e.key.removeprefix('aten::')} {100 * e.self_cpu_time_total / total:.0f}%"
        for e in averages[:count]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quickstart-dir", default=str(DEFAULT_DIR))
    parser.add_argument(
        "--model-dir",
        default=None,
        help="a Hugging Face model folder to run instead of the quickstart's (with seeded "
        "random 21-token prompts)",
    )
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--profile", action="store_true", help="time phases, list top ops")
    parser.add_argument(
        "--dtype",
        choices=["both", "float32", "bfloat16"],
        default="both",
        help="rollout.dtype of the engine and the dtype of generate's model",
    )
    parser.add_argument(
        "--module-forward",
        action="store_true",
        help="also time an engine with rollout.lean_decode off (decode steps through the "
        "model's modules)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.model_dir:
        model_path = Path(args.model_dir)
    else:
        paths = prepare_quickstart(Path(args.quickstart_dir))
        model_path = paths.model_path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if args.model_dir:
        # no task data: seeded random prompts of the quickstart prompts' length
        generator = torch.Generator().manual_seed(0)
        all_prompts = [
            torch.randint(3, len(tokenizer) - 1, (21,), generator=generator).tolist()
            for _ in range(args.prompts)
        ]
    else:
        data = DataConfig(val_files=[str(paths.val_file)], max_prompt_length=64)
        dataset = PromptDataset.validation(data, tokenizer)
        assert dataset is not None
        all_prompts = [list(record.prompt_ids) for record in dataset.records]
    pad = pad_token_id_of(tokenizer)

    def bound_engine(lean_decode: bool, dtype: str) -> HFRolloutEngine:
        config = HFRolloutConfig(colocate=True, lean_decode=lean_decode, dtype=dtype)
        recipe = Recipe(
            model=ModelConfig(path=str(model_path), dtype="float32"),
            rollout=config,
            trainer=TrainerConfig(seed=0),
        )
        engine = HFRolloutEngine(
            config, PartContext(recipe=recipe, device=CpuDevice(), tokenizer=tokenizer)
        )
        engine.bind_model(model, version=0)
        return engine

    stop = sorted(default_stop_token_ids(model, tokenizer))
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]

    print(
        f"{'the model of ' + str(model_path) if args.model_dir else 'quickstart model'} "
        f"({sum(p.numel() for p in model.parameters()):,} params), "
        f"cpu, {torch.get_num_threads()} threads, temperature 1, max {args.max_tokens} new "
        f"tokens, {args.repeats} alternating repeats"
    )
    print(
        f"{'case':<16}{'dtype':<10}{'side':<12}{'side s':>8}{'generate s':>12}{'side tok/s':>12}"
        f"{'generate tok/s':>16}{'best ratio':>12}{'median paired':>15}{'cpu ratio':>11}"
    )
    cases = ((args.prompts, 1), (max(1, args.prompts // 8), 8))
    profiles = []
    for (num_prompts, n), dtype in itertools.product(cases, dtypes):
        engines = {"engine": bound_engine(lean_decode=True, dtype=dtype)}
        if args.module_forward:
            engines["module fwd"] = bound_engine(lean_decode=False, dtype=dtype)
        reference = model if dtype == "float32" else copy.deepcopy(model).to(torch.bfloat16)
        prompts = all_prompts[:num_prompts]
        params = SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens)

        def run_engine(engine: HFRolloutEngine, prompts=prompts, params=params) -> int:
            return sum(len(c.token_ids) for c in engine.generate(prompts, params))

        def run_generate(prompts=prompts, n=n, reference=reference) -> int:
            return generate_tokens(reference, prompts, n, args.max_tokens, pad, stop)

        runs: dict[str, Callable[[], int]] = {
            name: functools.partial(run_engine, engine) for name, engine in engines.items()
        }
        runs["generate"] = run_generate
        alternate(1, runs)  # warm-up
        timings = alternate(args.repeats, runs)
        rates = {name: [t / wall for wall, _, t in timings[name]] for name in timings}
        cpu_rates = {name: [t / cpu for _, cpu, t in timings[name]] for name in timings}
        best = {name: min(timings[name]) for name in timings}
        best_rate = {name: max(rates[name]) for name in rates}
        for name in engines:
            paired = statistics.median(
                e / g for e, g in zip(rates[name], rates["generate"], strict=True)
            )
            cpu_ratio = max(cpu_rates[name]) / max(cpu_rates["generate"])
            print(
                f"{f'{num_prompts} prompts x {n}':<16}{dtype:<10}{name:<12}{best[name][0]:>8.3f}"
                f"{best['generate'][0]:>12.3f}{best_rate[name]:>12.0f}"
                f"{best_rate['generate']:>16.0f}"
                f"{best_rate[name] / best_rate['generate']:>11.2f}x{paired:>14.2f}x"
                f"{cpu_ratio:>10.2f}x"
            )
        if args.profile:
            profiles.append((f"{num_prompts} prompts x {n}, {dtype}", runs, engines, reference))

    for case, runs, engines, reference in profiles:
        print(f"\n{case}: seconds by phase (the fastest of three calls of each side)")
        for name, run in runs.items():
            timer = engines.get(name)
            spent = min(
                (
                    engine_phases(timer, run) if timer is not None else phases(reference, run)
                    for _ in range(3)
                ),
                key=lambda p: p["total"],
            )
            print(
                f"  {name:<9} prompt passes {spent['prompt']:.3f}  decode steps "
                f"{spent['decode']:.3f}  rest {spent['rest']:.3f}  total {spent['total']:.3f}"
            )
        print(f"  engine's top torch operations (self time): {top_operations(runs['engine'])}")


if __name__ == "__main__":
    main()
