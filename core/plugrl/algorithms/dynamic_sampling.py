"""DAPO dynamic sampling (``algorithm.filter_groups``).

A group whose responses all score the same gives every response advantage 0 under a
group-relative estimator: it costs a training step and teaches nothing. Dynamic sampling
drops such groups and generates more prompts until the step has ``data.train_batch_size``
groups, giving up after ``max_num_gen_batches`` generation rounds (0: never).

A scheduler uses it as::

    sampler = DynamicSampler.from_recipe(recipe)
    while not sampler.ready:
        batch = generate_and_score()                  # one generation round
        sampler.add(batch, group_metric_values(batch, recipe.algorithm.filter_groups.metric))
    batch, metrics = sampler.take()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError

if TYPE_CHECKING:
    from plugrl.recipe import Recipe

METRIC_KEY = "algorithm.filter_groups.metric"


def group_metric_values(batch: Batch, metric: str) -> np.ndarray:
    """The per-response value that ``filter_groups`` compares, as a float array [B].

    ``metric`` is a column of the batch (a reward extra field such as ``acc``), or
    ``score``/``seq_reward`` (sum of ``token_level_scores``) or ``seq_final_reward`` (sum of
    ``token_level_rewards``, after any KL penalty).
    """
    if metric in batch:
        values = batch[metric]
    elif metric in ("score", "seq_reward") and "token_level_scores" in batch:
        values = batch["token_level_scores"].sum(dim=-1)
    elif metric == "seq_final_reward" and "token_level_rewards" in batch:
        values = batch["token_level_rewards"].sum(dim=-1)
    else:
        columns = ", ".join(sorted(batch.keys())) or "none"
        raise RecipeError(
            f"{metric!r} is neither a batch column nor score/seq_reward/seq_final_reward; "
            f"the batch has {columns}",
            key=METRIC_KEY,
        )
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise RecipeError(
            f"column {metric!r} does not hold numbers (first value {values[0]!r})", key=METRIC_KEY
        ) from None
    if array.ndim != 1:
        raise RecipeError(
            f"column {metric!r} has shape {array.shape}; it must hold one number per response",
            key=METRIC_KEY,
        )
    return array


def filter_groups(batch: Batch, metric_values: Sequence[float]) -> tuple[Batch, dict[str, float]]:
    """Keep the groups (same ``uid``) whose metric differs between responses, and groups of
    one. Returns the kept rows in their order and ``filter_groups/kept_groups``,
    ``filter_groups/dropped_groups``."""
    values = np.asarray(metric_values, dtype=np.float64)
    if values.shape != (len(batch),):
        raise ValueError(f"got {values.shape[0]} metric values for a batch of {len(batch)} rows")
    uids = batch["uid"]
    rows_of: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        rows_of.setdefault(uid, []).append(row)
    kept_rows: list[int] = []
    kept = 0
    for rows in rows_of.values():
        group = values[rows]
        if len(rows) == 1 or np.std(group) > 0:
            kept += 1
            kept_rows.extend(rows)
    kept_rows.sort()
    metrics = {
        "filter_groups/kept_groups": float(kept),
        "filter_groups/dropped_groups": float(len(rows_of) - kept),
    }
    return batch.select(np.asarray(kept_rows, dtype=np.int64)), metrics


class DynamicSampler:
    """Collects kept groups over generation rounds until a step has ``target_groups``."""

    def __init__(self, target_groups: int, max_num_gen_batches: int = 0, metric: str = "acc"):
        if target_groups <= 0:
            raise ValueError(f"target_groups must be > 0, got {target_groups}")
        self.target_groups = target_groups
        self.max_num_gen_batches = max_num_gen_batches
        self.metric = metric
        self._reset()

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> DynamicSampler:
        config = recipe.algorithm.filter_groups
        return cls(recipe.data.train_batch_size, config.max_num_gen_batches, config.metric)

    def _reset(self) -> None:
        self._batches: list[Batch] = []
        self.num_groups = 0
        self.num_gen_batches = 0
        self._dropped = 0

    @property
    def ready(self) -> bool:
        """Enough groups are collected for a step."""
        return self.num_groups >= self.target_groups

    def add(self, batch: Batch, metric_values: Sequence[float] | None = None) -> dict[str, float]:
        """Filter one generation round's batch and keep its varied groups.

        ``metric_values`` default to :func:`group_metric_values` of ``self.metric``. Raises a
        :class:`DataError` when ``max_num_gen_batches`` rounds still leave the step short.
        """
        if metric_values is None:
            metric_values = group_metric_values(batch, self.metric)
        kept, metrics = filter_groups(batch, metric_values)
        self.num_gen_batches += 1
        self._dropped += int(metrics["filter_groups/dropped_groups"])
        if len(kept):
            self._batches.append(kept)
            self.num_groups += int(metrics["filter_groups/kept_groups"])
        limit = self.max_num_gen_batches
        if not self.ready and limit > 0 and self.num_gen_batches >= limit:
            raise DataError(
                f"dynamic sampling kept {self.num_groups} of the {self.target_groups} prompt "
                f"groups a step needs after {self.num_gen_batches} generation rounds: most "
                f"groups have the same {self.metric!r} for every response (data too easy or "
                "too hard?); raise algorithm.filter_groups.max_num_gen_batches or set it to 0 "
                "for no limit"
            )
        return metrics

    def take(self) -> tuple[Batch, dict[str, float]]:
        """The step's batch (the first ``target_groups`` kept groups, surplus dropped) and
        ``train/num_gen_batches`` plus totals; then start collecting for the next step."""
        if not self.ready:
            raise RuntimeError(
                f"only {self.num_groups} of {self.target_groups} groups collected; "
                "add batches until ready"
            )
        batch = Batch.concat(self._batches)
        seen: dict[Any, int] = {}
        for uid in batch["uid"]:
            seen.setdefault(uid, len(seen))
        wanted = {uid for uid, order in seen.items() if order < self.target_groups}
        rows = np.asarray([uid in wanted for uid in batch["uid"]], dtype=bool)
        metrics = {
            "train/num_gen_batches": float(self.num_gen_batches),
            "filter_groups/kept_groups": float(self.num_groups),
            "filter_groups/dropped_groups": float(self._dropped),
            "filter_groups/surplus_groups": float(self.num_groups - self.target_groups),
        }
        self._reset()
        return batch.select(rows), metrics
