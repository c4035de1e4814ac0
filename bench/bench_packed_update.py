"""The fsdp2 actor update packed against padded (``actor.use_remove_padding``), side by side.

Two actors of the same model, one packed and one padded, take turns updating on the same
GRPO-shaped batch (left-padded prompts, right-padded responses of random lengths), with
token-budget micro-batches or the whole batch in one pass. Prints the median seconds of each
and their ratio. Any Hugging Face causal LM folder works; without one, a 4M-parameter Qwen2
(the tool quickstart's shape) is made with random weights.

    python bench/bench_packed_update.py [--model FOLDER] [--steps 4] [--batching budget]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from plugrl.data.batch import Batch
from plugrl.parts.backend import OptimConfig
from plugrl.parts.context import DistInfo, PartContext
from plugrl.recipe import ClusterConfig, ModelConfig, Recipe, TrainerConfig
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from plugrl_fsdp2.config import FSDP2ActorConfig


class Reinforce:
    needs_entropy = False
    needs_ref = False

    def __call__(self, micro_batch, log_prob, entropy, scale):
        mask = micro_batch["response_mask"].to(log_prob.dtype)
        loss = (-micro_batch["advantages"] * log_prob * mask).sum() / scale.num_tokens
        return loss, {}


def grpo_batch(rows: int, prompt: int, response: int, vocab: int, seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(prompt // 2, prompt + 1, (rows,), generator=generator)
    response_lens = torch.randint(4, response + 1, (rows,), generator=generator)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=generator)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        mask[i, prompt - int(prompt_lens[i]) : prompt + int(response_lens[i])] = 1
    response_mask = mask[:, prompt:].clone()
    return Batch(
        {
            "input_ids": ids * mask,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": (ids * mask)[:, prompt:].clone(),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response, generator=generator) * response_mask,
            "old_log_probs": torch.zeros(rows, response),
        }
    )


def actor(model: Path, rows: int, **options: Any) -> FSDP2Backend:
    """A set-up fsdp2 actor of ``model`` whose mini-batch is ``rows`` rows, with more
    ``FSDP2ActorConfig`` options."""
    recipe = Recipe(
        model=ModelConfig(path=str(model)),
        actor=FSDP2ActorConfig(optim=OptimConfig(lr=1e-4), ppo_mini_batch_size=rows, **options),
        trainer=TrainerConfig(seed=0),
        cluster=ClusterConfig(mode="local", num_cpus=1),
    )
    context = PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo())
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(100)
    return backend


def quickstart_shaped_model(folder: Path) -> Path:
    """A 4M-parameter Qwen2 of the tool quickstart's shape, with random weights."""
    from plugrl.testing import save_tiny_model

    return save_tiny_model(
        folder,
        tokenizer_vocab_size=306,
        vocab_size=306,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Hugging Face model folder")
    parser.add_argument("--steps", type=int, default=4, help="measured updates of each")
    parser.add_argument("--batching", choices=["budget", "whole"], default="budget")
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(args.model) if args.model else quickstart_shaped_model(Path(scratch) / "m")
        budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": args.budget}
        backends = {
            packed: actor(
                model,
                args.rows,
                use_remove_padding=packed,
                **(budget if args.batching == "budget" else {}),
            )
            for packed in (True, False)
        }
        vocab = backends[True]._hf_config.vocab_size
        batch = grpo_batch(args.rows, 32, 48, vocab, seed=0)
        real = int(batch["attention_mask"].sum())
        times: dict[bool, list[float]] = {True: [], False: []}
        for step in range(args.steps + 1):
            # alternate which goes first, so both see the same machine load
            for packed in (True, False) if step % 2 else (False, True):
                start = time.perf_counter()
                backends[packed].update_policy(batch.copy(), Reinforce())
                if step:  # the first update of each warms up
                    times[packed].append(time.perf_counter() - start)
    packed_s, padded_s = (statistics.median(times[p]) for p in (True, False))
    ratios = [p / q for p, q in zip(times[True], times[False], strict=True)]
    print(
        f"update of {args.rows} rows ({real} real tokens), {args.batching} batching, "
        f"{args.threads} threads, {args.steps} measured updates each"
    )
    ratio = packed_s / padded_s
    print(f"packed {packed_s:.3f} s, padded {padded_s:.3f} s: packed/padded {ratio:.2f}x")
    print(f"paired per update: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
