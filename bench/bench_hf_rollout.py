"""The ``hf`` rollout engine against ``model.generate`` on the same prompts and model.

Uses the quickstart's warm-started model (built, or reused, under ``--quickstart-dir``) and its
validation prompts. Each case samples at temperature 1 with the same stop tokens and token
limit, alternating the engine and ``model.generate`` and keeping the best of ``--repeats``
runs, then prints side by side the time per call, the response tokens per second (tokens up to
and including the stop token; ``generate``'s padding after it is not counted) and the ratio.

Cases: 64 prompts x 1 sample, and 8 prompts x 8 samples (GRPO-like groups; ``generate`` gets
``num_return_sequences``).

    python bench/bench_hf_rollout.py [--prompts 64] [--max-tokens 32] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from plugrl.data.batch import left_pad
from plugrl.data.dataset import PromptDataset, pad_token_id_of
from plugrl.parts.rollout import SamplingParams
from plugrl.quickstart import DEFAULT_DIR, prepare_quickstart
from plugrl.recipe import DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl_plugins.devices.cpu.device import CpuDevice
from plugrl_plugins.rollout.hf.config import HFRolloutConfig
from plugrl_plugins.rollout.hf.engine import HFRolloutEngine
from plugrl_plugins.rollout.hf.sampler import default_stop_token_ids


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


def best_of(repeats: int, runs: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Alternate the runs ``repeats`` times; keep each one's fastest (seconds, tokens)."""
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            tokens = run()
            seconds = time.perf_counter() - start
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quickstart-dir", default=str(DEFAULT_DIR))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = prepare_quickstart(Path(args.quickstart_dir))
    tokenizer = AutoTokenizer.from_pretrained(paths.model_path)
    model = AutoModelForCausalLM.from_pretrained(paths.model_path, dtype=torch.float32).eval()
    data = DataConfig(val_files=[str(paths.val_file)], max_prompt_length=64)
    dataset = PromptDataset.validation(data, tokenizer)
    assert dataset is not None
    all_prompts = [list(record.prompt_ids) for record in dataset.records]
    pad = pad_token_id_of(tokenizer)

    recipe = Recipe(
        model=ModelConfig(path=str(paths.model_path), dtype="float32"),
        rollout=HFRolloutConfig(colocate=True),
        trainer=TrainerConfig(seed=0),
    )
    engine = HFRolloutEngine(recipe, device=CpuDevice(), tokenizer=tokenizer)
    engine.bind_model(model, version=0)
    stop = sorted(default_stop_token_ids(model, tokenizer))

    print(
        f"quickstart model ({sum(p.numel() for p in model.parameters()):,} params, float32), "
        f"cpu, {torch.get_num_threads()} threads, temperature 1, max {args.max_tokens} new "
        f"tokens, best of {args.repeats}"
    )
    print(
        f"{'case':<22}{'engine s':>10}{'generate s':>12}{'engine tok/s':>14}"
        f"{'generate tok/s':>16}{'ratio':>8}"
    )
    for num_prompts, n in ((args.prompts, 1), (max(1, args.prompts // 8), 8)):
        prompts = all_prompts[:num_prompts]
        params = SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens)

        def run_engine(prompts=prompts, params=params) -> int:
            return sum(len(c.token_ids) for c in engine.generate(prompts, params))

        def run_generate(prompts=prompts, n=n) -> int:
            return generate_tokens(model, prompts, n, args.max_tokens, pad, stop)

        best_of(1, {"engine": run_engine, "generate": run_generate})  # warm-up
        best = best_of(args.repeats, {"engine": run_engine, "generate": run_generate})
        (engine_s, engine_tokens), (generate_s, generate_tokens_) = best["engine"], best["generate"]
        engine_rate, generate_rate = engine_tokens / engine_s, generate_tokens_ / generate_s
        print(
            f"{f'{num_prompts} prompts x {n}':<22}{engine_s:>10.3f}{generate_s:>12.3f}"
            f"{engine_rate:>14.0f}{generate_rate:>16.0f}{engine_rate / generate_rate:>7.2f}x"
        )


if __name__ == "__main__":
    main()
