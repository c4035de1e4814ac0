"""Token-budget micro-batches (``actor.use_dynamic_bsz``) against a fixed micro-batch size.

Runs one fsdp2 actor update over the same batch of variable-length responses with the same
model, once per way of cutting micro-batches, alternating the two ways and keeping the best
of a few repeats, and prints side by side:

* time of the update, and its ratio to the fixed micro-batch size;
* peak activation memory: the largest amount of tensor memory one micro-batch keeps for its
  backward (counted with autograd's saved-tensor hooks, so it is exact on any device), and
  on CUDA also the device's peak allocation;
* tokens computed: rows x columns of the micro-batches after cutting shared padding, against
  the tokens the rows really hold.

The token budget defaults to the fixed size times the longest sequence, the most a fixed
micro-batch can hold, so token-budget batching is never allowed more memory than the fixed
size needs in its worst case.

    python bench/bench_dynamic_bsz.py [--rows 64] [--micro 8] [--repeats 3] [--device cpu]
                                      [--threads N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from plugrl.data.batch import Batch
from plugrl.parts.algorithm import LossScale
from plugrl.parts.backend import OptimConfig
from plugrl.parts.context import DistInfo, PartContext
from plugrl.recipe import ModelConfig, Recipe
from plugrl.testing import save_tiny_model
from plugrl_fsdp2.backend import FSDP2Backend
from plugrl_fsdp2.config import FSDP2ActorConfig

VOCAB = 4096


def save_model(folder: Path, max_length: int) -> Path:
    """A tiny Qwen2 model (hidden 256, 4 layers, a vocabulary of VOCAB, untied embeddings)
    that takes sequences of ``max_length`` tokens."""
    return save_tiny_model(
        folder,
        seed=0,
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_length,
        tie_word_embeddings=False,
    )


def make_batch(rows: int, max_prompt: int, max_response: int, seed: int = 0) -> Batch:
    """Prompts of 16..max_prompt tokens; responses with a long tail (log-normal lengths, median
    about a ninth of the maximum), as sampled reasoning responses are."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(16, max_prompt + 1, (rows,), generator=generator)
    median = max_response / 9
    normal = torch.randn(rows, generator=generator)
    response_lens = (median * torch.exp(0.9 * normal)).round().clamp(8, max_response).long()
    width = max_prompt + max_response
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        ids[i, max_prompt - p : max_prompt + r] = torch.randint(
            1, VOCAB, (p + r,), generator=generator
        )
        mask[i, max_prompt - p : max_prompt + r] = 1
    response_mask = mask[:, max_prompt:].clone()
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, max_prompt:].clone(),
            "response_mask": response_mask,
            "old_log_probs": torch.zeros(rows, max_response),
            "advantages": torch.randn(rows, max_response, generator=generator) * response_mask,
        }
    )


class Reinforce:
    """Token-mean REINFORCE over the global mini-batch."""

    needs_entropy = False
    needs_ref = False

    def __call__(
        self, micro_batch: Batch, log_prob: torch.Tensor, entropy: Any, scale: LossScale
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro_batch["response_mask"].to(log_prob.dtype)
        loss = (-micro_batch["advantages"] * log_prob * mask).sum()
        return loss * scale.dp_size / scale.num_tokens, {}


class ActivationMeter:
    """Bytes of tensors autograd keeps for backward, per micro-batch (a micro-batch starts at
    the model's forward), and the tokens each micro-batch computes."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.peak_bytes = 0
        self.tokens = 0
        self.micro_batches = 0
        self._storages: set[int] = set()
        self._bytes = 0
        model.register_forward_pre_hook(self._start_micro_batch, with_kwargs=True)

    def _start_micro_batch(self, module: Any, args: Any, kwargs: dict) -> None:
        self.finish()
        mask = kwargs["attention_mask"]
        self.tokens += mask.shape[0] * mask.shape[1]
        self.micro_batches += 1

    def finish(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._bytes)
        self._storages.clear()
        self._bytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._storages:
            self._storages.add(storage.data_ptr())
            self._bytes += storage.nbytes()
        return tensor

    def reset(self) -> None:
        self.peak_bytes = self.tokens = self.micro_batches = 0


def build(model_dir: Path, device_name: str, rows: int, **actor: Any) -> FSDP2Backend:
    from plugrl.plugin.manager import get_plugin_manager

    device = get_plugin_manager().registry("devices").load(device_name)()
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir), dtype="float32"),
        actor=FSDP2ActorConfig(ppo_mini_batch_size=rows, optim=OptimConfig(lr=1e-5), **actor),
    )
    context = PartContext(recipe=recipe, role="actor", device=device, dist=DistInfo())
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(100)
    return backend


def measure(backend: FSDP2Backend, meter: ActivationMeter, batch: Batch) -> tuple[float, int]:
    """One update: (seconds, peak device bytes or 0 off CUDA)."""
    meter.reset()
    cuda = backend.torch_device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda tensor: tensor):
        start = time.perf_counter()
        backend.update_policy(batch, Reinforce())
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    meter.finish()
    return elapsed, torch.cuda.max_memory_allocated() if cuda else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="sequences in the mini-batch")
    parser.add_argument("--micro", type=int, default=8, help="fixed micro-batch size")
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-response", type=int, default=512)
    parser.add_argument("--budget", type=int, default=None, help="token budget per micro-batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    budget = args.budget or args.micro * (args.max_prompt + args.max_response)
    batch = make_batch(args.rows, args.max_prompt, args.max_response)
    real_tokens = int(batch["attention_mask"].sum())
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_model(Path(folder), args.max_prompt + args.max_response)
        ways = {
            f"fixed micro-batch {args.micro}": build(
                model_dir, args.device, args.rows, ppo_micro_batch_size_per_gpu=args.micro
            ),
            f"token budget {budget}": build(
                model_dir,
                args.device,
                args.rows,
                use_dynamic_bsz=True,
                ppo_max_token_len_per_gpu=budget,
            ),
        }
        meters = {name: ActivationMeter(b.model) for name, b in ways.items()}
        best: dict[str, tuple[float, int, int, int, int]] = {}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for name, backend in ways.items():
                elapsed, device_peak = measure(backend, meters[name], batch)
                meter = meters[name]
                if repeat and (name not in best or elapsed < best[name][0]):
                    best[name] = (
                        elapsed,
                        meter.peak_bytes,
                        device_peak,
                        meter.tokens,
                        meter.micro_batches,
                    )
    lengths = batch["attention_mask"].sum(-1).float()
    print(
        f"{args.rows} sequences, {real_tokens} tokens (length mean {lengths.mean():.0f}, "
        f"max {lengths.max():.0f}); model 4 layers x 256, vocab {VOCAB}; device "
        f"{args.device}; best of {args.repeats} updates"
    )
    base_time, base_peak, base_device, _, _ = next(iter(best.values()))
    for name, (elapsed, peak, device_peak, tokens, micro_batches) in best.items():
        device_part = ""
        if device_peak:
            device_part = (
                f" | device peak {device_peak / 2**20:7.1f} MiB x{device_peak / base_device:.2f}"
            )
        print(
            f"{name:26s} {micro_batches:3d} micro-batches | time {elapsed:6.2f} s "
            f"x{elapsed / base_time:.2f} | peak activations {peak / 2**20:7.1f} MiB "
            f"x{peak / base_peak:.2f}{device_part} | tokens computed {tokens} "
            f"({tokens / real_tokens:.2f} x real)"
        )


if __name__ == "__main__":
    main()
