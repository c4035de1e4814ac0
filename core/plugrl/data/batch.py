"""``Batch``: the columnar data a run passes between parts.

A batch of B rows holds tensors of shape [B, ...] and non-tensor columns (numpy object arrays of
length B: ``uid``, ``data_source``, ``ground_truth``, ``extra_info``...), plus ``meta``, a dict
of batch-level values. It pickles as plain tensors and arrays, so it crosses Ray through the
object store.

Column names follow verl: ``prompts`` [B, P] (left-padded), ``responses`` [B, R]
(right-padded), ``input_ids``/``attention_mask``/``position_ids`` [B, P+R],
``response_mask`` [B, R], ``old_log_probs``, ``ref_log_prob``, ``rollout_log_probs``,
``token_level_scores``, ``token_level_rewards``, ``values``, ``advantages``, ``returns`` [B, R].
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as ``(ids, attention_mask)`` [B, longest], each row's tokens at the
    right end (left padding with ``pad_token_id``, mask 0 there), as prompts are fed to a
    causal LM. An empty list gives a row of padding."""
    width = max((len(sequence) for sequence in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if len(sequence):
            ids[row, width - len(sequence) :] = torch.as_tensor(list(sequence), dtype=torch.long)
            mask[row, width - len(sequence) :] = 1
    return ids, mask


def _as_column(values: Any, name: str) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


class Batch:
    """Tensors and non-tensor columns that share their first dimension."""

    __slots__ = ("columns", "meta", "tensors")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        columns: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.columns: dict[str, np.ndarray] = {}
        self.meta: dict[str, Any] = dict(meta or {})
        for name, tensor in (tensors or {}).items():
            self[name] = tensor
        for name, values in (columns or {}).items():
            self[name] = values

    # ------------------------------------------------------------------------ mapping access

    def __len__(self) -> int:
        for tensor in self.tensors.values():
            return int(tensor.shape[0])
        for column in self.columns.values():
            return len(column)
        return 0

    def __contains__(self, name: object) -> bool:
        return name in self.tensors or name in self.columns

    def __getitem__(self, name: str) -> Any:
        if name in self.tensors:
            return self.tensors[name]
        if name in self.columns:
            return self.columns[name]
        raise KeyError(f"batch has no column {name!r}; it has {', '.join(self.keys()) or 'none'}")

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"column {name!r} must have a batch dimension, got a scalar")
            self.columns.pop(name, None)
            self._check_length(name, int(value.shape[0]))
            self.tensors[name] = value
        else:
            column = _as_column(value, name)
            self.tensors.pop(name, None)
            self._check_length(name, len(column))
            self.columns[name] = column

    def _check_length(self, name: str, length: int) -> None:
        expected = self._length_without(name)
        if expected is not None and length != expected:
            raise ValueError(f"column {name!r} has {length} rows, the batch has {expected}")

    def _length_without(self, name: str) -> int | None:
        for key, tensor in self.tensors.items():
            if key != name:
                return int(tensor.shape[0])
        for key, column in self.columns.items():
            if key != name:
                return len(column)
        return None

    def keys(self) -> list[str]:
        return [*self.tensors, *self.columns]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401 (this *is* get)

    def pop(self, name: str) -> Any:
        if name in self.tensors:
            return self.tensors.pop(name)
        if name in self.columns:
            return self.columns.pop(name)
        raise KeyError(name)

    def require(self, *names: str, by: str = "this step") -> None:
        """Raise a ``KeyError`` naming every missing column and who needed it."""
        missing = [name for name in names if name not in self]
        if missing:
            raise KeyError(
                f"{by} needs batch columns {', '.join(missing)}; the batch has "
                f"{', '.join(self.keys()) or 'none'}"
            )

    # ------------------------------------------------------------------------ row operations

    def select(self, index: Sequence[int] | torch.Tensor | np.ndarray | slice) -> Batch:
        """Rows by position (indices, boolean mask or slice), keeping ``meta``."""
        if isinstance(index, slice):
            np_index: Any = index
            t_index: Any = index
        else:
            np_index = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)
            if np_index.dtype == bool:
                np_index = np.nonzero(np_index)[0]
            np_index = np_index.astype(np.int64)
            t_index = torch.from_numpy(np_index)
        out = Batch(meta=self.meta)
        for name, tensor in self.tensors.items():
            out.tensors[name] = tensor[
                t_index.to(tensor.device) if isinstance(t_index, torch.Tensor) else t_index
            ]
        for name, column in self.columns.items():
            out.columns[name] = column[np_index]
        return out

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of ``size`` rows (the last may be smaller)."""
        if size <= 0:
            raise ValueError(f"split size must be > 0, got {size}")
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, parts: int) -> list[Batch]:
        """``parts`` chunks of equal size; the batch size must divide evenly."""
        if parts <= 0 or len(self) % parts:
            raise ValueError(f"cannot split {len(self)} rows into {parts} equal chunks")
        return self.split(len(self) // parts)

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each row ``times`` times: ``aabb`` when interleaved (rollout.n), else ``abab``."""
        index = (np.repeat if interleave else np.tile)(np.arange(len(self)), times)
        return self.select(index)

    @classmethod
    def concat(cls, batches: Iterable[Batch]) -> Batch:
        """Rows of several batches with the same columns; ``meta`` of the first."""
        batches = list(batches)
        if not batches:
            return cls()
        keys = set(batches[0].keys())
        for i, batch in enumerate(batches[1:], start=1):
            if set(batch.keys()) != keys:
                raise ValueError(
                    f"cannot concat: batch {i} has columns {sorted(batch.keys())}, "
                    f"batch 0 has {sorted(keys)}"
                )
        out = cls(meta=batches[0].meta)
        for name in batches[0].tensors:
            out.tensors[name] = torch.cat([b.tensors[name] for b in batches])
        for name in batches[0].columns:
            out.columns[name] = np.concatenate([b.columns[name] for b in batches])
        return out

    def union(self, other: Batch) -> Batch:
        """Columns of both (same rows); a name in both must hold equal values."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        out = self.copy()
        for name, tensor in other.tensors.items():
            if name in out.tensors and not torch.equal(out.tensors[name], tensor):
                raise ValueError(f"cannot union: column {name!r} differs")
            out.tensors[name] = tensor
        for name, column in other.columns.items():
            out.columns[name] = column
        out.meta.update(other.meta)
        return out

    def copy(self) -> Batch:
        """A shallow copy: new dicts, same tensors."""
        out = Batch(meta=self.meta)
        out.tensors = dict(self.tensors)
        out.columns = dict(self.columns)
        return out

    def to(self, device: torch.device | str) -> Batch:
        out = self.copy()
        out.tensors = {name: t.to(device) for name, t in self.tensors.items()}
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.tensors.items())
        cols = ", ".join(self.columns)
        return f"Batch({len(self)} rows; tensors: {shapes or '-'}; columns: {cols or '-'})"

    def __getstate__(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "columns": self.columns, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensors = state["tensors"]
        self.columns = state["columns"]
        self.meta = state["meta"]
