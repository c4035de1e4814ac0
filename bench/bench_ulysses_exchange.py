"""The exchange around each attention of a sequence-parallel forward
(``actor.ulysses_sequence_parallel_size``), two ways on the CPU with gloo: one
``all_to_all_single`` (what plugrl_fsdp2.ulysses does) against an ``all_gather`` of every
rank's whole slice followed by slicing out this rank's heads (what works where a backend has no
all-to-all). Both give the same tensor; the script checks it, then prints milliseconds per
exchange of queries ``[1, heads, sequence / ranks, head_dim]`` and their ratio.

    python bench/bench_ulysses_exchange.py [--ranks 2] [--heads 16] [--head-dim 128]
        [--lengths 2048 8192] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def by_all_gather(x: torch.Tensor, group_size: int, rank: int) -> torch.Tensor:
    """``[b, heads, s/sp, d]`` -> ``[b, heads/sp, s, d]``: gather every slice, keep my heads."""
    pieces = [torch.empty_like(x) for _ in range(group_size)]
    dist.all_gather(pieces, x.contiguous())
    return torch.cat([piece.chunk(group_size, dim=1)[rank] for piece in pieces], dim=2)


def timed(fn, repeats: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    dist.barrier()
    return (time.perf_counter() - start) / repeats * 1e3


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    from plugrl_fsdp2.ulysses import _all_to_all

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks
    )
    group = dist.group.WORLD
    try:
        for length in args.lengths:
            generator = torch.Generator().manual_seed(rank)
            x = torch.randn(1, args.heads, length // args.ranks, args.head_dim, generator=generator)
            ours = _all_to_all(x, group, 1, 2)
            torch.testing.assert_close(ours, by_all_gather(x, args.ranks, rank), rtol=0, atol=0)
            a2a = timed(lambda x=x: _all_to_all(x, group, 1, 2), args.repeats)
            gather = timed(lambda x=x: by_all_gather(x, args.ranks, rank), args.repeats)
            if rank == 0:
                megabytes = x.numel() * x.element_size() / 2**20
                print(
                    f"sequence {length:6d} ({megabytes:5.1f} MB per rank): all_to_all_single "
                    f"{a2a:7.2f} ms, all_gather + slicing {gather:7.2f} ms, "
                    f"ratio {gather / a2a:.2f}x"
                )
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from plugrl.cluster.distributed import free_port

    mp.spawn(rank_main, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
