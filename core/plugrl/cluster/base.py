"""Worker groups: the ranks of one role, driven as one backend from the driver.

A worker group splits a batch across its data-parallel ranks, calls the same backend method on
every rank, and gathers what comes back from the ranks that hold outputs (one per data-parallel
index: tensors concatenated in index order, metrics averaged; the weights every rank yields).
Subclasses only say how a method reaches the ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.data.batch import Batch

if TYPE_CHECKING:
    import torch

    from plugrl.parts.algorithm import ActorObjective
    from plugrl.parts.backend import Role
    from plugrl.parts.rollout import WeightMeta
    from plugrl.recipe import Recipe


# --------------------------------------------------------------------------------------------
# Dispatch helpers
# --------------------------------------------------------------------------------------------


def split_for_dp(
    batch: Batch, dp_size: int, *, pad: bool = False, mini_batch_size: int | None = None
) -> tuple[list[Batch], int]:
    """Cut ``batch`` into ``dp_size`` shards of equal size, one per data-parallel rank.
    Returns the shards and the number of padding rows added at the end.

    Every rank must get as many rows as the others (they run collectives in lockstep). With
    ``pad`` a batch that does not divide evenly is filled up with copies of its first rows
    (for computations whose padded outputs are dropped again, see :func:`unpad`); without it,
    it is an error.

    Shards are consecutive rows. With ``mini_batch_size`` (rows per optimizer step, over all
    ranks) each mini-batch is dealt out separately, so that the ranks' ``i``-th local
    mini-batches together are the batch's ``i``-th consecutive mini-batch, as on one rank.
    """
    if dp_size <= 0:
        raise ValueError(f"dp_size must be > 0, got {dp_size}")
    rows = len(batch)
    padding = -rows % dp_size
    if padding:
        if not pad:
            raise ValueError(
                f"a batch of {rows} rows cannot be split evenly over {dp_size} data-parallel "
                f"ranks; make data.train_batch_size x rollout.n a multiple of {dp_size}"
            )
        if rows == 0:
            raise ValueError("cannot pad an empty batch")
        filler = [i % rows for i in range(padding)]
        batch = Batch.concat([batch, batch.select(filler)])
    size = mini_batch_size
    if dp_size == 1 or not size or size % dp_size or rows % size:
        return batch.chunk(dp_size), padding
    share = size // dp_size
    shards = []
    for rank in range(dp_size):
        index = [
            start + rank * share + offset
            for start in range(0, rows, size)
            for offset in range(share)
        ]
        shards.append(batch.select(index))
    return shards, padding


def concat_outputs(outputs: Sequence[Any]) -> Any:
    """Join per-rank outputs in rank order: tensors along rows, dicts of tensors key by key."""
    import torch

    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(outputs))
    if isinstance(first, dict):
        return {key: torch.cat([output[key] for output in outputs]) for key in first}
    if isinstance(first, Batch):
        return Batch.concat(outputs)
    raise TypeError(f"cannot concatenate outputs of type {type(first).__name__}")


def unpad(output: Any, padding: int) -> Any:
    """Drop the last ``padding`` rows :func:`split_for_dp` added."""
    if not padding:
        return output
    if isinstance(output, dict):
        return {key: value[:-padding] for key, value in output.items()}
    if isinstance(output, Batch):
        return output.select(slice(0, len(output) - padding))
    return output[:-padding]


def average_metrics(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the ranks that report it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for metrics in per_rank:
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value)
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


# --------------------------------------------------------------------------------------------
# Worker groups
# --------------------------------------------------------------------------------------------


class WorkerGroup(ABC):
    """The ranks of one role (``actor``, ``ref``, ``critic``) of the chosen training backend,
    with the :class:`~plugrl.parts.backend.TrainingBackend` methods applied to all of them.

    Batches go in whole and come back whole: the group splits them by data-parallel rank.
    """

    recipe: Recipe
    role: Role
    world_size: int
    dp_ranks: list[int]
    """The data-parallel index of each rank (ranks that share one get the same shard)."""
    output_ranks: list[bool]
    """Whether each rank holds the outputs of its data-parallel index
    (:attr:`TrainingBackend.is_output_rank`)."""
    in_process: bool = False
    """The backends live in this process (a local group)."""

    def _check_output_ranks(self) -> None:
        """Every data-parallel index needs exactly one rank holding its outputs."""
        holders: dict[int, int] = {}
        for rank, (dp_rank, holds) in enumerate(zip(self.dp_ranks, self.output_ranks, strict=True)):
            if holds:
                if dp_rank in holders:
                    raise RuntimeError(
                        f"ranks {holders[dp_rank]} and {rank} both say they hold the outputs of "
                        f"data-parallel index {dp_rank}; a backend's is_output_rank must pick one"
                    )
                holders[dp_rank] = rank
        missing = sorted(set(range(self.dp_size)) - set(holders))
        if missing:
            raise RuntimeError(
                f"no rank holds the outputs of data-parallel index {missing[0]}; a backend's "
                "is_output_rank must be true on one rank of each"
            )

    @property
    def dp_size(self) -> int:
        return max(self.dp_ranks) + 1 if self.dp_ranks else 1

    # ---------------------------------------------------------------- how calls reach ranks

    @abstractmethod
    def _call_workers(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        """Call the :class:`~plugrl.cluster.worker.BackendWorker` method ``method`` on every
        rank at once, rank ``i`` with ``per_rank_args[i]``; return the results in rank order."""

    def _call_ranks(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        """Call the backend method ``method`` on every rank (see :meth:`_call_workers`)."""
        return self._call_workers("call", [(method, *args) for args in per_rank_args], **kwargs)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call a backend method with the same arguments on every rank; results in rank order."""
        return self._call_ranks(method, [args] * self.world_size, **kwargs)

    def _shard_args(self, shards: list[Any]) -> list[tuple]:
        """Per-rank arguments: the shard of each rank's data-parallel index."""
        return [(shards[dp_rank],) for dp_rank in self.dp_ranks]

    def _outputs(self, results: list) -> list:
        """The results of the output rank of each data-parallel index, in index order."""
        held = {
            dp_rank: result
            for dp_rank, holds, result in zip(
                self.dp_ranks, self.output_ranks, results, strict=True
            )
            if holds
        }
        return [held[i] for i in range(self.dp_size)]

    def _dispatch_batch(self, method: str, batch: Batch, *, pad: bool, **kwargs: Any) -> Any:
        shards, padding = split_for_dp(batch, self.dp_size, pad=pad)
        results = self._call_ranks(method, self._shard_args(self._put_all(shards)), **kwargs)
        return unpad(concat_outputs(self._outputs(results)), padding)

    def _put_all(self, shards: list[Batch]) -> list[Any]:
        """Hook for groups that hand data over by reference (Ray's object store)."""
        return shards

    # ---------------------------------------------------------------- the backend's methods

    def setup(self, total_training_steps: int) -> None:
        self.execute_all("setup", total_training_steps)

    def compute_log_prob(
        self,
        batch: Batch,
        *,
        calculate_entropy: bool = False,
        calculate_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        # the keyword travels only when asked: a backend that cannot compute the column
        # need not take it (TrainingBackend.computes_sum_pi_squared)
        extra = {"calculate_sum_pi_squared": True} if calculate_sum_pi_squared else {}
        return self._dispatch_batch(
            "compute_log_prob", batch, pad=True, calculate_entropy=calculate_entropy, **extra
        )

    def compute_ref_log_prob(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self._dispatch_batch("compute_ref_log_prob", batch, pad=True)

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return self._dispatch_batch("compute_values", batch, pad=True)

    @property
    def mini_batch_rows(self) -> int:
        """Sequences per optimizer step over all ranks (``ppo_mini_batch_size x rollout.n``)."""
        return self.recipe.actor.mini_batch_rows(self.recipe.rollout.n)

    def update_policy(self, batch: Batch, objective: ActorObjective) -> dict[str, float]:
        shards, _ = split_for_dp(batch, self.dp_size, mini_batch_size=self.mini_batch_rows)
        shared = self._put_all([objective])[0]
        args = [(shard, shared) for (shard,) in self._shard_args(self._put_all(shards))]
        return average_metrics(self._outputs(self._call_ranks("update_policy", args)))

    def update_critic(self, batch: Batch) -> dict[str, float]:
        shards, _ = split_for_dp(batch, self.dp_size, mini_batch_size=self.mini_batch_rows)
        results = self._call_ranks("update_critic", self._shard_args(self._put_all(shards)))
        return average_metrics(self._outputs(results))

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full weights with Hugging Face names: what every rank yielded, in rank order (with
        FSDP rank 0 yields them all; under pipeline parallelism each stage its own)."""
        return [weight for weights in self.execute_all("named_weights") for weight in weights]

    def weight_metadata(self) -> list[WeightMeta]:
        """Name, shape and dtype of every weight, without gathering (the same on every rank)."""
        return self.execute_all("weight_metadata")[0]

    def stream_weight_buckets(self, bucket_bytes: int) -> Iterator[Any]:
        """The weights in buckets of at most ``bucket_bytes``, as the ranks make them: lists of
        named tensors in a local group, object-store references on Ray (the driver passes
        them on without fetching). Every rank takes part; the buckets come in rank order."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream weights")

    def transport_send(self, transport_name: str, session: Any) -> list:
        """Run the worker side of weight transport ``transport_name`` on every rank."""
        return self._call_workers("transport_send", [(transport_name, session)] * self.world_size)

    def rollout_model(self) -> Any:
        """The live model for a colocated engine in the driver process, or ``None``."""
        return None

    def save_checkpoint(self, path: str | Path) -> None:
        self.execute_all("save_checkpoint", Path(path))

    def load_checkpoint(self, path: str | Path) -> None:
        self.execute_all("load_checkpoint", Path(path))

    def export_hf(self, path: str | Path) -> None:
        self.execute_all("export_hf", Path(path))

    def close(self) -> None:
        """Release the backends (and, for Ray, the actors and their placement)."""
        self.execute_all("close")
