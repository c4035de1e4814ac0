"""Step metrics under verl's names, so dashboards and habits carry over.

* ``critic/{score,rewards,advantages,returns,values}/{mean,max,min}``
* ``response_length/{mean,max,min,clip_ratio}``, ``prompt_length/{mean,max,min,clip_ratio}``
* ``timing_s/<phase>`` from :class:`StepTimer`
* ``perf/{total_num_tokens,time_per_step,throughput}``
* ``perf/driver_rss_gb``: the driver process's resident memory now (not its peak), which tells
  a leak (it keeps growing) from an allocator that grew once and holds its memory
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.errors import PlugrlError

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch


def resident_memory_gb() -> float | None:
    """This process's resident memory now, in GiB; ``None`` where the system does not say
    (it is read from ``/proc/self/statm``, on Linux)."""
    import os

    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 1024**3


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(
    batch: Batch, max_response_length: int, max_prompt_length: int | None = None
) -> dict[str, float]:
    """Metrics of a trained batch: scores and rewards per sequence, advantages, returns and
    values per valid token, response and prompt lengths."""
    mask = batch["response_mask"].bool()
    metrics: dict[str, float] = {}
    for column, prefix in (
        ("token_level_scores", "critic/score"),
        ("token_level_rewards", "critic/rewards"),
    ):
        if column in batch:
            metrics.update(_stats(prefix, batch[column].sum(dim=-1)))
    for column, prefix in (
        ("advantages", "critic/advantages"),
        ("returns", "critic/returns"),
        ("values", "critic/values"),
    ):
        if column in batch:
            metrics.update(_stats(prefix, batch[column][mask]))
    if "values" in batch and "returns" in batch:
        returns, values = batch["returns"][mask].float(), batch["values"][mask].float()
        var_returns = returns.var(unbiased=False)
        if var_returns > 0:
            explained = 1 - (returns - values).var(unbiased=False) / var_returns
            metrics["critic/vf_explained_var"] = explained.item()
    metrics.update(length_metrics(batch, max_response_length, max_prompt_length))
    return metrics


def length_metrics(
    batch: Batch, max_response_length: int | None = None, max_prompt_length: int | None = None
) -> dict[str, float]:
    """``response_length/{mean,max,min}`` and, with the batch's ``prompt_attention_mask``,
    ``prompt_length/{mean,max,min}``, in tokens (a response's appended tool results and
    observations count: they fill its length budget); each ``clip_ratio`` (the fraction of
    rows at the limit) when its limit is given."""
    from plugrl.data.batch import response_attention_mask

    metrics: dict[str, float] = {}
    lengths = response_attention_mask(batch).bool().sum(dim=-1)
    metrics.update(_stats("response_length", lengths))
    if max_response_length:
        metrics["response_length/clip_ratio"] = (
            (lengths >= max_response_length).float().mean().item()
        )
    if "prompt_attention_mask" in batch:
        prompt_lengths = batch["prompt_attention_mask"].sum(dim=-1)
        metrics.update(_stats("prompt_length", prompt_lengths))
        if max_prompt_length:
            metrics["prompt_length/clip_ratio"] = (
                (prompt_lengths >= max_prompt_length).float().mean().item()
            )
    return metrics


def compute_throughput_metrics(
    num_tokens: int, step_seconds: float, num_ranks: int
) -> dict[str, float]:
    """``perf/throughput`` is tokens (prompt + response) per second per rank, as in verl."""
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / max(num_ranks, 1),
    }


class StepTimer:
    """Accumulates wall time per phase: ``with timer("gen"): ...`` -> ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{phase}": seconds for phase, seconds in self.seconds.items()}


def mean_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Average each key over the records that have it (micro-batches, ranks, epochs)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        for key, value in record.items():
            if hasattr(value, "item"):
                value = value.item()
            sums[key] += float(value)
            counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


METRICS_FILE = "metrics.jsonl"
"""The file in a run folder where the ``jsonl`` logger appends one JSON object per step."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run folder's ``metrics.jsonl``, in file order; a line cut short by a
    killed run is skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise PlugrlError(
            f"{path} not found: is {run_dir} a plugrl run folder (it has "
            f"{METRICS_FILE} when the run uses the jsonl logger)?"
        )
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
