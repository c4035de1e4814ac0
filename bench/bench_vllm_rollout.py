"""The ``vllm`` rollout engine against the ``hf`` engine on the same prompts and model.

Run it where plugrl-vllm and vLLM are installed (``plugins/rollout/vllm/test-env.sh`` builds
``.venv-vllm``)::

    .venv-vllm/bin/python bench/bench_vllm_rollout.py [--prompts 64] [--max-tokens 32]
        [--repeats 5] [--dtype float32|bfloat16] [--threads N]

Uses the quickstart's warm-started model (built, or reused, under ``--quickstart-dir``) and its
validation prompts. Both engines hold their own copy of the model, in ``--dtype`` (their
``rollout.dtype``), and sample at temperature 1 with their default stop tokens. Each case
alternates the two engines ``--repeats`` times after a warm-up and prints the best time per
call, response tokens per second, the ratio of the best rates, and the median of the per-repeat
ratios (each repeat runs both back to back, so a burst of load from other processes hits both).
vLLM sets torch's thread count when it starts; the script sets it again (``--threads``,
default: what vLLM chose) so both engines run with the same number.

Cases: ``--prompts`` prompts x 1 sample, and 8 prompts x 8 samples (GRPO-like groups).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from plugrl.data.dataset import PromptDataset
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import SamplingParams
from plugrl.recipe import DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from plugrl_tools.quickstart import DEFAULT_DIR, prepare_quickstart

NEEDS_VLLM = (
    "bench_vllm_rollout needs vLLM and plugrl-vllm: run it with .venv-vllm/bin/python "
    "(plugins/rollout/vllm/test-env.sh builds .venv-vllm)"
)


def alternate(
    repeats: int, runs: dict[str, Callable[[], int]]
) -> dict[str, list[tuple[float, int]]]:
    """Run each of ``runs`` in turn, ``repeats`` times: (wall seconds, tokens) per run."""
    timings: dict[str, list[tuple[float, int]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            tokens = run()
            timings[name].append((time.perf_counter() - start, tokens))
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quickstart-dir", default=str(DEFAULT_DIR))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    # checked before the quickstart is built (minutes): the engine imports vLLM only on start
    if not all(importlib.util.find_spec(name) for name in ("vllm", "plugrl_vllm")):
        raise SystemExit(NEEDS_VLLM)

    from transformers import AutoTokenizer

    from plugrl_vllm.config import VLLMRolloutConfig
    from plugrl_vllm.engine import VLLMRolloutEngine

    paths = prepare_quickstart(Path(args.quickstart_dir))
    tokenizer = AutoTokenizer.from_pretrained(paths.model_path)
    data = DataConfig(val_files=[str(paths.val_file)], max_prompt_length=64)
    dataset = PromptDataset.validation(data, tokenizer)
    assert dataset is not None
    all_prompts = [list(record.prompt_ids) for record in dataset.records]

    model = ModelConfig(path=str(paths.model_path), dtype=args.dtype)
    trainer = TrainerConfig(seed=0)
    data = DataConfig(max_prompt_length=64, max_response_length=args.max_tokens)
    context = {"device": CpuDevice(), "tokenizer": tokenizer}
    loop = asyncio.new_event_loop()

    async def build() -> tuple[Any, Any]:
        hf_config = HFRolloutConfig(colocate=False, dtype=args.dtype)
        hf = HFRolloutEngine(
            hf_config,
            PartContext(recipe=Recipe(model=model, data=data, trainer=trainer), **context),
        )
        vllm_config = VLLMRolloutConfig(colocate=False, dtype=args.dtype)
        vllm = VLLMRolloutEngine(
            vllm_config,
            PartContext(recipe=Recipe(model=model, data=data, trainer=trainer), **context),
        )
        return hf, vllm

    hf, vllm = loop.run_until_complete(build())
    if args.threads:
        torch.set_num_threads(args.threads)
    else:
        torch.set_num_threads(torch.get_num_threads())
    print(f"dtype {args.dtype}, torch threads {torch.get_num_threads()}, ", end="")
    print(f"max tokens {args.max_tokens}, repeats {args.repeats}")
    print(
        f"{'case':<18}{'vllm s':>9}{'hf s':>9}{'vllm tok/s':>12}{'hf tok/s':>10}"
        f"{'best ratio':>12}{'median ratio':>14}"
    )
    engines = {"vllm": vllm, "hf": hf}
    for num_prompts, n in ((args.prompts, 1), (8, 8)):
        prompts = (all_prompts * (num_prompts // len(all_prompts) + 1))[:num_prompts]
        params = SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens)

        def runner(
            engine: Any, prompts: list[list[int]] = prompts, params: SamplingParams = params
        ) -> Callable[[], int]:
            def run() -> int:
                completions = loop.run_until_complete(engine.generate_batch(prompts, params))
                return sum(len(c.token_ids) for c in completions)

            return run

        runs = {name: runner(engine) for name, engine in engines.items()}
        alternate(1, runs)  # warm-up
        timings = alternate(args.repeats, runs)
        rates = {name: [t / s for s, t in timings[name]] for name in engines}
        best = {name: min(s for s, _ in timings[name]) for name in engines}
        best_rate = {name: max(rates[name]) for name in engines}
        paired = statistics.median(v / h for v, h in zip(rates["vllm"], rates["hf"], strict=True))
        print(
            f"{f'{num_prompts} prompts x {n}':<18}{best['vllm']:>9.3f}{best['hf']:>9.3f}"
            f"{best_rate['vllm']:>12.0f}{best_rate['hf']:>10.0f}"
            f"{best_rate['vllm'] / best_rate['hf']:>11.2f}x{paired:>13.2f}x"
        )
    vllm.close()
    hf.close()
    loop.close()


if __name__ == "__main__":
    main()
