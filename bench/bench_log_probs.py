"""The chunked log-probs (``plugrl.algorithms.token_log_probs``) against the float32
log-softmax with autograd that the fsdp2 update used before, side by side: the forward and
backward of one micro-batch's response logits, the two taking turns, on the CPU.

Both compute the log-probs of ``tokens`` targets under ``softmax(logits / temperature)``
and the gradient of their sum (and the entropy's, with ``--entropy``) with respect to the
logits. Prints each side's median seconds, their ratio and the median of the paired
per-round ratios.

    python bench/bench_log_probs.py [--tokens 512] [--vocab 32000] [--dtype bfloat16]
        [--rounds 10] [--entropy] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from plugrl.algorithms.token_log_probs import token_log_probs


def log_softmax_way(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> torch.Tensor:
    """The earlier formula: the logits upcast whole, divided, logsumexp and gather."""
    scaled = logits.float() / temperature
    log_norm = torch.logsumexp(scaled, dim=-1)
    loss = (scaled.gather(-1, targets[:, None]).squeeze(-1) - log_norm).sum()
    if with_entropy:
        loss = loss + (log_norm - (torch.softmax(scaled, dim=-1) * scaled).sum(-1)).sum()
    return loss


def chunked_way(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> torch.Tensor:
    log_prob, entropy = token_log_probs(
        logits, targets, temperature, with_entropy=with_entropy, overwrite_logits=True
    )
    return log_prob.sum() + (entropy.sum() if entropy is not None else 0)


def one_round(
    way: Callable[..., torch.Tensor],
    head: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> float:
    leaf = head.clone().requires_grad_()
    start = time.perf_counter()
    logits = leaf * 1  # an operation's output, as a model's head gives
    way(logits, targets, temperature, with_entropy).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--entropy", action="store_true", help="the entropy with its gradient too")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    head = torch.randn(args.tokens, args.vocab, generator=generator).to(getattr(torch, args.dtype))
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    ways = {"log-softmax": log_softmax_way, "chunked": chunked_way}
    for way in ways.values():  # warm-up
        one_round(way, head, targets, args.temperature, args.entropy)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            seconds[name].append(one_round(way, head, targets, args.temperature, args.entropy))
    before, after = (statistics.median(seconds[name]) for name in ways)
    paired = statistics.median(
        a / b for a, b in zip(seconds["chunked"], seconds["log-softmax"], strict=True)
    )
    print(
        f"{args.tokens} tokens x {args.vocab} vocabulary, {args.dtype}, temperature "
        f"{args.temperature}{', entropy with gradient' if args.entropy else ''}: "
        f"log-softmax {before * 1000:.1f} ms, chunked {after * 1000:.1f} ms, "
        f"chunked/log-softmax {after / before:.2f}x (paired {paired:.2f}x)"
    )


if __name__ == "__main__":
    main()
