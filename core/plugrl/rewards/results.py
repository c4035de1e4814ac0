"""What every reward manager reports once its samples are scored: the per-sample result, the
extra columns (verl's ``reward_extra_info``) and the score metrics, the same whichever manager
(or where) the samples were scored."""

from __future__ import annotations

import math
from collections import defaultdict
from numbers import Real
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch


@attrs.define
class SampleResult:
    """One response's score, its extra fields, and how scoring went."""

    score: float = 0.0
    extras: dict[str, Any] = attrs.field(factory=dict)
    status: str = "ok"  # ok | error | timeout
    message: str = ""


def extra_columns(results: list[SampleResult]) -> dict[str, list[Any]]:
    """One column per extra field any result has (``None`` where a result lacks it); the
    ``score`` column, when there is one, holds every successful sample's score."""
    keys: list[str] = []
    for result in results:
        keys += [k for k in result.extras if k not in keys]
    columns = {key: [r.extras.get(key) for r in results] for key in keys}
    if "score" in columns:  # samples whose scorer returned a bare number have a score too
        columns["score"] = [r.score if r.status == "ok" else None for r in results]
    return columns


def is_number(value: Any) -> bool:
    """A finite real number (``bool`` included: ``acc`` averages as 0/1)."""
    return isinstance(value, Real) and math.isfinite(float(value))


def score_metrics(
    results: list[SampleResult], data_sources: list[str], totals: torch.Tensor
) -> dict[str, float]:
    """``reward/errors``, ``reward/timeouts``, ``critic/score/{mean,max,min}`` of ``totals``
    (each response's total reward), ``reward/<data_source>/score`` and the mean of each
    numeric extra field per data source (``acc`` counts failed samples as wrong)."""
    metrics: dict[str, float] = {
        "reward/errors": float(sum(r.status == "error" for r in results)),
        "reward/timeouts": float(sum(r.status == "timeout" for r in results)),
    }
    if len(results):
        metrics["critic/score/mean"] = float(totals.mean())
        metrics["critic/score/max"] = float(totals.max())
        metrics["critic/score/min"] = float(totals.min())
    by_source: dict[str, list[SampleResult]] = defaultdict(list)
    for data_source, result in zip(data_sources, results, strict=True):
        by_source[data_source].append(result)
    for data_source, group in sorted(by_source.items()):
        prefix = f"reward/{data_source}"
        metrics[f"{prefix}/score"] = sum(r.score for r in group) / len(group)
        fields: dict[str, list[float]] = defaultdict(list)
        for result in group:
            for key, value in result.extras.items():
                if key != "score" and is_number(value):
                    fields[key].append(float(value))
        for key, values in fields.items():
            if key == "acc":  # failed samples count as wrong
                metrics[f"{prefix}/acc"] = sum(values) / len(group)
            else:
                metrics[f"{prefix}/{key}"] = sum(values) / len(values)
    return metrics
