"""``Batch``: the columnar data a run passes between parts.

A batch of B rows holds tensors of shape [B, ...] and non-tensor columns (numpy object arrays of
length B: ``uid``, ``data_source``, ``ground_truth``, ``extra_info``...), plus ``meta``, a dict
of batch-level values. It pickles as plain tensors and arrays, so it crosses Ray through the
object store.

Column names follow verl: ``prompts`` [B, P] (left-padded), ``responses`` [B, R]
(right-padded), ``input_ids``/``attention_mask``/``position_ids`` [B, P+R],
``response_mask`` [B, R], ``old_log_probs``, ``ref_log_prob``, ``rollout_log_probs``,
``token_level_scores``, ``token_level_rewards``, ``values``, ``advantages``, ``returns`` [B, R].

A batch in that layout records it in ``meta`` (:data:`LAYOUT_KEYS`: ``prompt_width`` P,
``response_width`` R, ``pad_token_id``; :func:`plugrl.data.rollout_batch.build_rollout_batch`
writes them), so that :meth:`Batch.concat` can join batches whose longest prompts or
responses differ by padding each to the widest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch

LAYOUT_KEYS = ("prompt_width", "response_width", "pad_token_id")
"""``meta`` keys of a batch in the prompt/response layout: P, R and the token that pads."""
PROMPT_COLUMNS = frozenset({"prompts", "prompt_attention_mask"})
"""[B, P], left-padded."""
SEQUENCE_COLUMNS = frozenset({"input_ids", "attention_mask", "position_ids"})
"""[B, P+R] (``position_ids`` also [B, k, P+R] for mrope): a left-padded prompt part, then a
right-padded response part. Any other tensor column whose second dimension is R in every
batch is a response column, right-padded."""
MULTIMODAL_COLUMN = "multi_modal_inputs"
"""Non-tensor column of a vision-language model's image inputs, one mapping of tensors per row
(``None`` for a row without images): see :mod:`plugrl.data.multimodal`."""
IMAGES_COLUMN = "prompt_images"
"""Non-tensor column beside :data:`MULTIMODAL_COLUMN`: each row's images as encoded bytes
(PNG, JPEG, ...), a tuple in placeholder order (empty for a row without images), for engines
that run the model's processor themselves (vLLM, SGLang)."""
VIDEOS_COLUMN = "prompt_videos"
"""Non-tensor column beside :data:`IMAGES_COLUMN`: each row's videos, a tuple in placeholder
order of ``{"frames": (PNG bytes, ...), "fps": float}`` (the sampled frames and their rate),
for the same engines."""
TOKEN_COLUMNS = frozenset({"prompts", "responses", "input_ids"})
"""Columns padded with the pad token; the others are padded with 0, except positions."""


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
        """Rows of several batches with the same columns; ``meta`` of the first.

        Batches that record their layout (:data:`LAYOUT_KEYS`) may differ in prompt and
        response width: each is padded to the widest, as if the rows had been assembled
        together. Without a layout, tensor columns must have the same width.
        """
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
        layouts = [_Layout.of(batch) for batch in batches]
        out = cls(meta=batches[0].meta)
        known = [layout for layout in layouts if layout is not None]
        target = _widest(known) if len(known) == len(layouts) else None
        for name in batches[0].tensors:
            tensors = [b.tensors[name] for b in batches]
            if target is None:
                missing = layouts.index(None)
                _check_same_width(
                    name,
                    tensors,
                    f"batch {missing} records no layout ({', '.join(LAYOUT_KEYS)} in meta, as "
                    "build_rollout_batch writes them) to pad by",
                )
            elif (
                name in PROMPT_COLUMNS
                or name in SEQUENCE_COLUMNS
                or _is_response_column(tensors, known)
            ):
                tensors = [
                    _pad_to(name, t, layout, target)
                    for t, layout in zip(tensors, known, strict=True)
                ]
            else:
                responses = " and ".join(dict.fromkeys(str(x.response_width) for x in known))
                _check_same_width(
                    name,
                    tensors,
                    f"it is not response-wide ({responses}) in every batch, so its padding is "
                    "unknown",
                )
            out.tensors[name] = torch.cat(tensors)
        if target is not None:
            out.meta.update(target.meta())
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


# --------------------------------------------------------------------------------------------
# Padding batches of the prompt/response layout to one width
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _Layout:
    """A batch's prompt width P, response width R and pad token, from its ``meta``."""

    prompt_width: int
    response_width: int
    pad_token_id: int

    @classmethod
    def of(cls, batch: Batch) -> _Layout | None:
        if not all(key in batch.meta for key in LAYOUT_KEYS):
            return None
        return cls(*(int(batch.meta[key]) for key in LAYOUT_KEYS))

    def meta(self) -> dict[str, int]:
        return {
            "prompt_width": self.prompt_width,
            "response_width": self.response_width,
            "pad_token_id": self.pad_token_id,
        }


def _widest(layouts: Sequence[_Layout]) -> _Layout:
    pads = sorted({layout.pad_token_id for layout in layouts})
    if len(pads) > 1:
        listed = " and ".join(map(str, pads))
        raise ValueError(f"cannot concat batches padded with different pad token ids ({listed})")
    return _Layout(
        max(layout.prompt_width for layout in layouts),
        max(layout.response_width for layout in layouts),
        pads[0],
    )


def _check_same_width(name: str, tensors: Sequence[torch.Tensor], why: str) -> None:
    shapes = ["x".join(map(str, t.shape[1:])) or "1" for t in tensors]
    if len(set(shapes)) > 1:
        widths = " and ".join(dict.fromkeys(shapes))
        raise ValueError(f"cannot concat column {name!r} of widths {widths}: {why}")


def _is_response_column(tensors: Sequence[torch.Tensor], layouts: Sequence[_Layout]) -> bool:
    return all(
        t.dim() >= 2 and t.shape[1] == layout.response_width
        for t, layout in zip(tensors, layouts, strict=True)
    )


def _pad(
    tensor: torch.Tensor, dim: int, *, before: int = 0, after: int = 0, value: Any = 0
) -> torch.Tensor:
    """``tensor`` with ``before`` and ``after`` slices of ``value`` added along ``dim``;
    ``value="edge"`` repeats the last slice after it."""
    dim %= tensor.dim()
    parts = [tensor]
    for count, at_end in ((before, False), (after, True)):
        if not count:
            continue
        if value == "edge" and at_end:
            edge = tensor.narrow(dim, tensor.shape[dim] - 1, 1)
            filler = edge.expand(*[count if d == dim else -1 for d in range(tensor.dim())])
        else:
            shape = [count if d == dim else size for d, size in enumerate(tensor.shape)]
            filler = torch.full(shape, value, dtype=tensor.dtype, device=tensor.device)
        parts = [*parts, filler] if at_end else [filler, *parts]
    return torch.cat(parts, dim=dim) if len(parts) > 1 else tensor


def _pad_to(name: str, tensor: torch.Tensor, layout: _Layout, target: _Layout) -> torch.Tensor:
    """Column ``name`` of a batch in ``layout``, padded to the widths of ``target``."""
    fill = target.pad_token_id if name in TOKEN_COLUMNS else 0
    grow_prompt = target.prompt_width - layout.prompt_width
    grow_response = target.response_width - layout.response_width
    if name in PROMPT_COLUMNS or name in SEQUENCE_COLUMNS:
        expected = layout.prompt_width + (layout.response_width if name in SEQUENCE_COLUMNS else 0)
        if tensor.shape[-1] != expected:
            raise ValueError(
                f"column {name!r} is {tensor.shape[-1]} wide, but its batch's meta says "
                f"prompt_width {layout.prompt_width} and response_width {layout.response_width}"
            )
    if name in PROMPT_COLUMNS:
        return _pad(tensor, -1, before=grow_prompt, value=fill)
    if name in SEQUENCE_COLUMNS:
        prompt, response = tensor.split([layout.prompt_width, layout.response_width], dim=-1)
        # build_rollout_batch counts positions over real tokens only: 0 on the left padding,
        # the last token's position on the right padding
        response_fill = "edge" if name == "position_ids" else fill
        return torch.cat(
            [
                _pad(prompt, -1, before=grow_prompt, value=fill),
                _pad(response, -1, after=grow_response, value=response_fill),
            ],
            dim=-1,
        )
    return _pad(tensor, 1, after=grow_response, value=fill)


def response_attention_mask(batch: Batch) -> torch.Tensor:
    """[B, R]: 1 on every token of each response, the sampled ones and those an agent loop
    appended between turns (tool results, observations), 0 on padding: what a response's
    text and length are. ``response_mask`` is 1 on the sampled tokens only, the ones trained
    on. A batch without ``attention_mask`` gives ``response_mask``."""
    if "attention_mask" not in batch:
        return batch["response_mask"]
    width = batch["responses"].shape[-1]
    return batch["attention_mask"][:, -width:]
