"""The fsdp2 actor update with AdamW's fused kernel (what ``plugrl.algorithms.training.adamw``
builds on a CPU or CUDA) against torch's per-tensor Python loop (``_single_tensor_adam``,
torch's default on a CPU and on FSDP2's DTensor parameters off CUDA), side by side.

Two actors of the same model and recipe take turns running the update of the recipe's
objective on the same GRPO-shaped batch (``bench_skip_rows.grpo_batch``, token-budget
micro-batches as the quickstart recipe runs them); one has its AdamW groups switched to the
per-tensor loop. Prints, for each, the median seconds of the optimizer step alone and of the
whole update, their ratios, and the paired per-update ratios. That the two update the weights
alike (to 1e-6) and that a checkpoint of either resumes is tested in
``tests/plugins/backends/fsdp2/test_fsdp2_checkpoint.py``. Any Hugging Face causal LM folder
works; without one, a 4M-parameter Qwen2 (the tool quickstart's shape) is made with random
weights.

    python bench/bench_adamw.py [--model FOLDER] [--steps 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_packed_update import actor, quickstart_shaped_model
from bench_skip_rows import grpo_batch

from plugrl.algorithms.objective import PolicyObjective
from plugrl.plugin.manager import get_plugin_manager

KERNELS = ("fused", "per-tensor")


def timed_steps(optimizer: torch.optim.Optimizer, seconds: list[float]) -> None:
    """Append the wall time of each of ``optimizer``'s steps to ``seconds``."""
    started: list[float] = []

    def before(*_: Any) -> None:
        started.append(time.perf_counter())

    def after(*_: Any) -> None:
        seconds.append(time.perf_counter() - started.pop())

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Hugging Face model folder")
    parser.add_argument("--steps", type=int, default=6, help="measured updates of each")
    parser.add_argument("--groups", type=int, default=32, help="prompts per batch")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = args.groups * args.n
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(args.model) if args.model else quickstart_shaped_model(Path(scratch) / "m")
        budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": args.budget}
        backends = {kernel: actor(model, rows, **budget) for kernel in KERNELS}
        assert backends["fused"].optimizer.param_groups[0]["fused"] is True
        for group in backends["per-tensor"].optimizer.param_groups:
            group["fused"], group["foreach"] = False, False
        step_seconds: dict[str, list[float]] = {kernel: [] for kernel in KERNELS}
        for kernel in KERNELS:
            timed_steps(backends[kernel].optimizer, step_seconds[kernel])
        objective = PolicyObjective.from_recipe(backends["fused"].recipe, get_plugin_manager())
        vocab = backends["fused"]._hf_config.vocab_size
        # every group scores a mix, so both run every sequence
        batch = grpo_batch(args.groups, args.n, 0.0, 21, 48, vocab, seed=0)
        update_seconds: dict[str, list[float]] = {kernel: [] for kernel in KERNELS}
        for step in range(args.steps + 1):
            # alternate which goes first, so both see the same machine load
            for kernel in KERNELS if step % 2 else reversed(KERNELS):
                start = time.perf_counter()
                backends[kernel].update_policy(batch.copy(), objective)
                if step:  # the first update of each warms up (and creates AdamW's state)
                    update_seconds[kernel].append(time.perf_counter() - start)
                else:
                    step_seconds[kernel].clear()
    tokens = int(batch["attention_mask"].sum())
    print(
        f"fsdp2 update of {rows} rows ({tokens} real tokens), token budget {args.budget}, "
        f"{args.threads} threads, {args.steps} measured updates each"
    )
    medians = {
        kernel: (statistics.median(step_seconds[kernel]), statistics.median(update_seconds[kernel]))
        for kernel in KERNELS
    }
    for kernel, (step_s, update_s) in medians.items():
        print(f"{kernel:>10}: optimizer step {step_s:.3f} s, whole update {update_s:.3f} s")
    (fused_step, fused_update), (loop_step, loop_update) = medians["fused"], medians["per-tensor"]
    print(
        f"fused / per-tensor: optimizer step {fused_step / loop_step:.2f}x, whole update "
        f"{fused_update / loop_update:.2f}x (saves {loop_update - fused_update:.3f} s)"
    )
    paired = [
        fused / loop
        for fused, loop in zip(update_seconds["fused"], update_seconds["per-tensor"], strict=True)
    ]
    print(f"paired per update: {', '.join(f'{ratio:.2f}' for ratio in paired)}")


if __name__ == "__main__":
    main()
