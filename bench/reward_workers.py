"""How much scoring in worker processes costs against calling the scorer in the driver.

Scores the same responses three ways, side by side in one run, and prints each way's time as
a ratio of the in-process time:

* in-process: a plain loop decoding each response and calling the scoring function (no
  timeout protection);
* naive: the ``naive`` manager (one worker process, per-sample deadlines);
* parallel: the ``parallel`` manager with 2 worker processes.

Two scorers: the quickstart's arithmetic scorer (a few microseconds a sample, so the worker
round trip dominates) and boxed MATH answers that need math-verify (about a millisecond).

    python bench/reward_workers.py [--samples 2000]
"""

from __future__ import annotations

import argparse
import time

import torch

from plugrl.data.batch import Batch
from plugrl.parts.context import PartContext
from plugrl.parts.reward import RewardConfig
from plugrl.parts.scoring import Scorer
from plugrl.recipe import Recipe
from plugrl_reward_managers.managers import (
    NaiveRewardManager,
    ParallelRewardConfig,
    ParallelRewardManager,
)
from plugrl_scorers import arithmetic, math_boxed


class ByteTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i > 0).decode("utf-8", errors="replace")


def batch_of(texts: list[str], truths: list[str], source: str) -> Batch:
    encoded = [t.encode() for t in texts]
    width = max(len(e) for e in encoded)
    responses = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for row, data in enumerate(encoded):
        responses[row, : len(data)] = torch.tensor(list(data))
        mask[row, : len(data)] = 1
    return Batch(
        tensors={"responses": responses, "response_mask": mask},
        columns={
            "data_source": [source] * len(texts),
            "ground_truth": truths,
            "extra_info": [None] * len(texts),
        },
    )


def timed(function, repeats: int = 3) -> float:
    function()  # warm: worker start, imports
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    n = args.samples
    cases = {
        "arithmetic": (
            arithmetic.compute_score,
            [f"Let me add.\nAnswer: {i if i % 3 else i + 1}" for i in range(n)],
            [str(i) for i in range(n)],
        ),
        "boxed MATH": (
            math_boxed.compute_score,
            [f"So the value is $\\boxed{{\\frac{{{i}}}{{{2 * i + 2}}}}}$." for i in range(n)],
            [f"\\frac{{{i if i % 2 else i + 1}}}{{{2 * i + 2}}}" for i in range(n)],
        ),
    }
    tokenizer = ByteTokenizer()
    print(f"{n} samples per batch; best of 3; ratio = time / in-process time")
    for name, (function, texts, truths) in cases.items():
        batch = batch_of(texts, truths, "bench")

        def in_process(function=function, batch=batch, truths=truths) -> None:
            rows = zip(batch["responses"], batch["response_mask"], truths, strict=True)
            for ids, mask, truth in rows:
                text = tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                function("bench", text, truth, None)

        def resolve(_: str, function=function, label=name) -> Scorer:
            return Scorer.wrap(function, label)

        naive_recipe = Recipe(reward=RewardConfig())
        naive = NaiveRewardManager(
            naive_recipe.reward, PartContext(recipe=naive_recipe, tokenizer=tokenizer)
        )
        parallel_recipe = Recipe(reward=ParallelRewardConfig(num_workers=2))
        parallel = ParallelRewardManager(
            parallel_recipe.reward, PartContext(recipe=parallel_recipe, tokenizer=tokenizer)
        )
        naive.resolve = parallel.resolve = resolve
        try:
            base = timed(in_process)
            naive_time = timed(lambda naive=naive, batch=batch: naive(batch))
            parallel_time = timed(lambda parallel=parallel, batch=batch: parallel(batch))
        finally:
            naive.close()
            parallel.close()
        print(
            f"{name:12s} in-process {base * 1e6 / n:7.1f} us/sample | "
            f"naive x{naive_time / base:5.2f} | parallel(2) x{parallel_time / base:5.2f}"
        )


if __name__ == "__main__":
    main()
