"""The ``parallel`` reward manager's worker count: the old default (the CPU count, at most 8,
fixed) against the new one (that count, grown while the scoring calls wait rather than
compute, up to ``reward.max_workers``), side by side in one run.

Two scorers, each scoring a batch of ``--samples`` responses per step:

* waits: sleeps ``--latency`` seconds a call, as a remote check or a code sandbox does;
* computes: spins ``--compute`` seconds of CPU a call, where more workers than cores cannot help
  (the new default must not be slower there).

Each default scores one warm-up batch (the pool starts, and the new one grows), then the two
take ``--steps`` batches in turns, so both see the same load. Printed: the median seconds per
batch of each and their ratio (old / new), the warm-up batch's seconds, and the worker count.

    python bench/bench_reward_pool.py [--samples 64] [--latency 0.1] [--compute 0.01] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from plugrl.data.batch import Batch
from plugrl.parts.context import PartContext
from plugrl.parts.scoring import FileFunction, Scorer
from plugrl.recipe import Recipe
from plugrl_reward_managers.managers import (
    ParallelRewardConfig,
    ParallelRewardManager,
    pool_members,
)

SCORERS = """
import time

LATENCY = {latency}
COMPUTE = {compute}


def waits(solution_str, ground_truth):
    time.sleep(LATENCY)
    return float(solution_str == ground_truth)


def computes(solution_str, ground_truth):
    start = time.process_time()
    while time.process_time() - start < COMPUTE:
        pass
    return float(solution_str == ground_truth)
"""


class ByteTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i > 0).decode("utf-8", errors="replace")


def batch_of(size: int) -> Batch:
    responses = torch.full((size, 1), ord("1"), dtype=torch.long)
    return Batch(
        tensors={"responses": responses, "response_mask": torch.ones_like(responses)},
        columns={
            "data_source": ["bench"] * size,
            "ground_truth": ["1"] * size,
            "extra_info": [None] * size,
        },
    )


def manager(config: ParallelRewardConfig, function: FileFunction) -> ParallelRewardManager:
    recipe = Recipe(reward=config)
    built = ParallelRewardManager(
        recipe.reward, PartContext(recipe=recipe, tokenizer=ByteTokenizer())
    )
    scorer = Scorer.wrap(function, function.name)
    built.resolve = lambda _: scorer
    return built


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds a waiting call sleeps")
    parser.add_argument("--compute", type=float, default=0.01, help="CPU seconds a call spins")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    old_count = max(1, min(cpus, 8))
    batch = batch_of(args.samples)
    print(
        f"{args.samples} samples per batch on {cpus} CPUs; old default: {old_count} workers; "
        f"median of {args.steps} batches after one warm-up; ratio = old / new seconds"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench_scorers.py"
        path.write_text(SCORERS.format(latency=args.latency, compute=args.compute))
        cases = [("waits", f"sleeps {args.latency:g} s"), ("computes", f"{args.compute:g} s CPU")]
        for name, what in cases:
            function = FileFunction(str(path), name)
            old = manager(ParallelRewardConfig(num_workers=old_count), function)
            new = manager(ParallelRewardConfig(), function)
            try:
                warm = {
                    label: timed(lambda m=m: m(batch)) for label, m in (("old", old), ("new", new))
                }
                seconds: dict[str, list[float]] = {"old": [], "new": []}
                for step in range(args.steps):
                    turns = [("old", old), ("new", new)]
                    for label, built in turns if step % 2 == 0 else turns[::-1]:
                        seconds[label].append(timed(lambda built=built: built(batch)))
                old_s, new_s = (statistics.median(seconds[k]) for k in ("old", "new"))
                workers = len(pool_members(new.pool()))
            finally:
                old.close()
                new.close()
            print(
                f"{name:8s} ({what}): old {old_s:6.2f} s | new {new_s:6.2f} s "
                f"({workers} workers) | x{old_s / new_s:5.1f} | warm-up batch: old "
                f"{warm['old']:.2f} s, new {warm['new']:.2f} s"
            )


if __name__ == "__main__":
    main()
