"""The KV cache of a running batch whose rows join and leave at any step.

:class:`SlotKV` keeps, per layer, one key and one value buffer ``[slots, heads, columns, dim]``
and a window of columns ``[begin, end)`` that the running rows use. Every row ends at ``end``,
and a decode step writes one new column at ``end`` for all rows. So:

* a decode step copies one column per layer into the buffers (no ``torch.cat`` of the whole
  cache); when the buffers are full they are reallocated at twice the window (amortised O(1));
* rows that leave are replaced by the last running rows (only those rows' windows are copied),
  and columns that have become padding for every remaining row leave the window;
* new rows are computed by a prompt pass that writes their keys and values directly into free
  slots, right-aligned at ``end``. Rows with the same prompt are computed once and copied, and
  the start that all prompts joining together share (a chat template, a system prompt) is
  computed once, in one column range for all of them: a row's valid columns are that shared
  range and its own tail, the columns between are masked;
* the attention mask is a table built when the rows change and sliced per step, handed to
  the model ready-made (4D), so the model builds no mask per step; positions come from per-row
  counters, so padding never shifts rotary positions;
* decode steps run attention with :func:`_decode_attention`, registered with transformers'
  ``AttentionInterface``: the model is the same, only its attention kernel for one-token queries;
  for the models :mod:`~plugrl_hf.lean` serves, decode steps and prompt
  passes are computed there directly on the weights and these buffers.

This needs the model's cache layers to be plain full-attention layers and an attention
implementation that takes a 4D mask (``sdpa``, ``eager``) for the prompt passes. Other models
(sliding-window layers, flash attention) use :class:`DynamicKV`: the model's own
``DynamicCache`` and 2D masks, where new rows can join only when the running batch is empty.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from plugrl.api.data import left_pad, model_inputs
from plugrl_hf.lean import LeanDecoder, lean_unsupported

MIN_COLUMNS = 64
MIN_SLOTS = 8
SHARE_MIN_TOKENS = 32
"""Rows joining together compute their common prompt start once when it saves at least this
many token computations ((rows - 1) x shared tokens)."""


def slot_kv_unsupported(model: Any) -> str | None:
    """Why :class:`SlotKV` cannot serve ``model`` (``None`` when it can)."""
    config = model.config.get_text_config(decoder=True)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"its attention implementation {attention!r} takes no ready 4D mask"
    layers = DynamicCache(config=config).layers
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if odd:
        return f"its cache has {', '.join(odd)} layers"
    return None


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


DECODE_ATTENTION = "plugrl_hf_decode"
"""The attention function of decode steps, registered with transformers' AttentionInterface."""

_model_attention: ContextVar[str] = ContextVar("plugrl_hf_model_attention", default="sdpa")


@functools.cache
def _cache_keyword(model_class: type) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` in the transformers
    versions that renamed it (passing ``past_key_values`` there warns at every start that it
    is deprecated), ``past_key_values`` in those before."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model``'s forward (see :func:`_cache_keyword`)."""
    return {_cache_keyword(type(model)): cache}


"""The model's own attention implementation, during a decode step."""

_OTHER_INPUTS = ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")


def _decode_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one new token per row, the query heads of each KV head packed together:
    one ``baddbmm`` (scores, scale and the additive mask ``[rows, kv_heads, 1, keys]``), a
    softmax and one ``bmm``. For these shapes it takes about half the time of
    ``scaled_dot_product_attention`` on a CPU. Attention with more inputs than these (soft
    capping, sinks, a position bias, dropout) goes to the model's own kernel."""
    if query.shape[2] != 1:
        # not a decode step of this engine (a forward of the model elsewhere meanwhile)
        return _model_attention_function(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if dropout or any(kwargs.get(name) is not None for name in _OTHER_INPUTS):
        return _model_attention_function(module)(
            module,
            query,
            key,
            value,
            attention_mask[:, :1],
            scaling=scaling,
            dropout=dropout,
            **kwargs,
        )
    rows, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    flat = rows * kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    scores = torch.baddbmm(
        attention_mask.reshape(flat, 1, length),
        query.reshape(flat, heads // kv_heads, dim),
        key.reshape(flat, length, dim).transpose(1, 2),
        alpha=scale,
    )
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    output = torch.bmm(weights, value.reshape(flat, length, dim))
    return output.reshape(rows, 1, heads, dim), None


def _model_attention_function(module: Any) -> Any:
    name = _model_attention.get()
    if name == "eager":
        # eager attention is each modeling file's own function
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


AttentionInterface.register(DECODE_ATTENTION, _decode_attention)


class _SlotCache(Cache):
    """The cache object the model's attention layers call: ``update`` writes into the slot
    buffers where :class:`SlotKV` says and returns the keys and values to attend to."""

    def __init__(self, store: SlotKV, num_layers: int) -> None:
        super().__init__(layers=[DynamicLayer() for _ in range(num_layers)])
        self.store = store

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.write(layer_idx, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.store.end - self.store.begin


class SlotKV:
    """Slot buffers for a batch that rows join and leave (see the module docstring).

    A row's valid columns are ``[prefix_begin, prefix_end)``, a prompt start it shares with
    the rows that joined with it (empty when none), and ``[tail, end)``: its own tokens. The
    columns between are masked; they cost nothing but a little attention.
    """

    merges = True

    def __init__(
        self,
        model: Any,
        *,
        device: torch.device,
        pad_token_id: int,
        max_slots: int,
        prefill_tokens: int,
        lean_decode: bool = True,
    ) -> None:
        config = model.config.get_text_config(decoder=True)
        self.num_layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.pad_token_id = pad_token_id
        self.max_slots = max_slots
        self.prefill_tokens = prefill_tokens
        self.additive_mask = config._attn_implementation == "eager"
        self.dtype = next(model.parameters()).dtype
        self.keys: list[torch.Tensor | None] = [None] * self.num_layers
        self.values: list[torch.Tensor | None] = [None] * self.num_layers
        self.slots = 0
        self.columns = 0
        self.size = 0
        self.begin = self.end = 0
        self.spans: list[tuple[int, int, int]] = []
        """Per row: ``(prefix_begin, prefix_end, tail)``."""
        self.table: torch.Tensor | None = None
        self.device = device
        self._target: tuple[slice, slice, slice] = (slice(0), slice(0), slice(0))
        self.cache = _SlotCache(self, self.num_layers)
        self.lean: LeanDecoder | None = None
        """Computes decode steps without the model's modules, for models it serves."""
        self.lean_unsupported = lean_unsupported(model) if lean_decode else "lean_decode is off"
        if self.lean_unsupported is None:
            self.lean = LeanDecoder(model)

    # ------------------------------------------------------------------------- the model side

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key_buffer, value_buffer = self.keys[layer], self.values[layer]
        if key_buffer is None or value_buffer is None:
            # zeros, not empty: a masked column must hold finite numbers (0 x NaN is NaN)
            key_buffer = keys.new_zeros((self.slots, keys.shape[1], self.columns, keys.shape[3]))
            value_buffer = values.new_zeros(
                (self.slots, values.shape[1], self.columns, values.shape[3])
            )
            self.keys[layer], self.values[layer] = key_buffer, value_buffer
        rows, columns, attend = self._target
        key_buffer[rows, :, columns] = keys
        value_buffer[rows, :, columns] = values
        return key_buffer[rows, :, attend], value_buffer[rows, :, attend]

    def forward_step(
        self, model: Any, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Feed one token per row; the logits of the next token per row."""
        if self.end == self.columns:
            self._relayout(self.slots, self.end - self.begin)
        size, begin, end = self.size, self.begin, self.end
        assert self.table is not None
        self._target = (slice(0, size), slice(end, end + 1), slice(begin, end + 1))
        if self.lean is not None and self.lean.usable():
            logits = self.lean.decode(self, input_ids, positions)
            self.end += 1
            return logits
        mask = self.table[:, :, :, begin : end + 1]
        # decode steps use _decode_attention (the same model, only the attention kernel)
        # on the decoder's config: a multimodal model's other parts keep their own kernels
        config = model.config.get_text_config(decoder=True)
        implementation = config._attn_implementation
        config._attn_implementation = DECODE_ATTENTION
        token = _model_attention.set(implementation)
        try:
            output = model(
                input_ids=input_ids[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                **_with_cache(model, self.cache),
                use_cache=True,
            )
        finally:
            config._attn_implementation = implementation
            _model_attention.reset(token)
        self.end += 1
        return output.logits[:, -1, :]

    # ------------------------------------------------------------------------ rows join

    def prefill(
        self, model: Any, prefixes: Sequence[Sequence[int]], counts: Sequence[int]
    ) -> list[int]:
        """Add ``counts[g]`` rows holding ``prefixes[g]``, computed once per prefix, and the
        start all prefixes share once for all. Returns which prefix each new row holds, in
        slot order (the first row of every prefix, then the copies)."""
        groups = len(prefixes)
        new_rows = sum(counts)
        common = _common_prefix_length(prefixes)
        if (groups - 1) * common < SHARE_MIN_TOKENS:
            common = 0
        suffixes = [prefix[common:] for prefix in prefixes]
        suffix_width = max(len(suffix) for suffix in suffixes)
        self._reserve(new_rows, common + suffix_width)
        first, end = self.size, self.end
        shared = (end - suffix_width - common, end - suffix_width)
        if common:
            self._prefill_pass(model, [prefixes[0][:common]], first, shared=None, end=shared[1])
            rows = slice(first + 1, first + groups)
            for buffer in (*self.keys, *self.values):
                if buffer is not None:
                    buffer[rows, :, shared[0] : shared[1]] = buffer[first, :, shared[0] : shared[1]]
        if suffix_width:
            rows_per_pass = max(1, self.prefill_tokens // (suffix_width + common))
            for chunk in range(0, groups, rows_per_pass):
                self._prefill_pass(
                    model,
                    suffixes[chunk : chunk + rows_per_pass],
                    first + chunk,
                    shared=shared if common else None,
                    end=end,
                )
        order = list(range(groups)) + [
            g for g, count in enumerate(counts) for _ in range(count - 1)
        ]
        spans = [
            (shared[0], shared[0] + common, end - len(suffixes[g]))
            if common
            else (end, end, end - len(prefixes[g]))
            for g in order
        ]
        copies = order[groups:]
        if copies:
            source = torch.tensor([first + g for g in copies], device=self.device)
            target = slice(first + groups, first + new_rows)
            low = min(_first_column(span) for span in spans)
            for buffer in (*self.keys, *self.values):
                if buffer is not None:
                    buffer[target, :, low:end] = buffer[source, :, low:end]
        self.size += new_rows
        self.spans += spans
        self.begin = min(_first_column(span) for span in self.spans)
        self._build_table()
        return order

    def _prefill_pass(
        self,
        model: Any,
        sequences: Sequence[Sequence[int]],
        first: int,
        *,
        shared: tuple[int, int] | None,
        end: int,
    ) -> None:
        """Compute ``sequences`` into the rows from ``first``, right-aligned at column
        ``end``, after the ``shared`` columns (a prompt start already computed) if any."""
        width = max(len(s) for s in sequences)
        if width == 0:
            return
        device = self.device
        ids = left_pad(sequences, self.pad_token_id)[0].to(device)
        lengths = torch.tensor([len(s) for s in sequences], device=device)
        offset = 0 if shared is None else shared[1] - shared[0]
        attend_from = end - width if shared is None else shared[0]
        query = end - width + torch.arange(width, device=device)  # absolute columns
        key = torch.arange(attend_from, end, device=device)
        own = (key[None, None, :] >= (end - lengths)[:, None, None]) & (
            key[None, None, :] <= query[None, :, None]
        )
        # a padding query attends to itself only, so no row of the mask is empty (an empty
        # row gives NaN, which would reach the buffers)
        allowed = own | (key[None, None, :] == query[None, :, None])
        if shared is not None:
            allowed = allowed | (key < shared[1])[None, None, :]
        pad = (width - lengths)[:, None]
        positions = offset + (torch.arange(width, device=device)[None, :] - pad).clamp(min=0)
        self._target = (
            slice(first, first + len(sequences)),
            slice(end - width, end),
            slice(attend_from, end),
        )
        if self.lean is not None and self.lean.usable():
            self.lean.prefill(self, ids, positions, allowed)
            return
        model(
            input_ids=ids,
            attention_mask=self._mask_values(allowed[:, None]),
            position_ids=positions,
            **_with_cache(model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )

    # ------------------------------------------------------------------------ rows leave

    def remove(self, drop: Sequence[int]) -> list[int]:
        """Remove the rows at ``drop``; returns, for every remaining row in its new place, its
        old place (the last rows fill the holes)."""
        dropped = set(drop)
        size = self.size - len(dropped)
        holes = [i for i in sorted(dropped) if i < size]
        movers = [i for i in range(size, self.size) if i not in dropped]
        order = list(range(size))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        spans = [self.spans[i] for i in order]
        if holes:
            low = min(_first_column(spans[h]) for h in holes)
            target = torch.tensor(holes, device=self.device)
            source = torch.tensor(movers, device=self.device)
            for buffer in (*self.keys, *self.values):
                if buffer is not None:
                    buffer[target, :, low : self.end] = buffer[source, :, low : self.end]
        self.size = size
        self.spans = spans
        # columns that are padding for every remaining row leave the window
        self.begin = min((_first_column(span) for span in spans), default=self.end)
        self._build_table()
        return order

    def weights_changed(self) -> None:
        """The model's weights were replaced or updated (copies of them are stale)."""
        if self.lean is not None:
            self.lean.forget()

    def reset(self, *, free: bool = False) -> None:
        """No rows; ``free`` also releases the buffers (and the decode step's fused weights)."""
        self.size = 0
        self.spans = []
        self.begin = self.end = 0
        self.table = None
        if free:
            self.weights_changed()
            self.keys = [None] * self.num_layers
            self.values = [None] * self.num_layers
            self.slots = self.columns = 0

    # ------------------------------------------------------------------------ layout

    def _reserve(self, new_rows: int, width: int) -> None:
        """Room for ``new_rows`` more rows whose prefixes are up to ``width`` columns wide."""
        slots = self.size + new_rows
        if self.size == 0:
            self.begin = self.end = width
            if slots > self.slots or width >= self.columns:
                self.keys = [None] * self.num_layers
                self.values = [None] * self.num_layers
                self.slots = self._slot_count(slots)
                self.columns = max(MIN_COLUMNS, _power_of_two_at_least(2 * width + 1))
            return
        if slots > self.slots or width > self.end or self.end == self.columns:
            self._relayout(self._slot_count(slots), max(self.end - self.begin, width))

    def _slot_count(self, needed: int) -> int:
        return max(needed, min(max(MIN_SLOTS, 2 * self.slots), self.max_slots))

    def _relayout(self, slots: int, end: int) -> None:
        """Move the window to ``[end - width, end)`` of new buffers with ``slots`` slots and
        room to grow."""
        width = self.end - self.begin
        begin = end - width
        columns = max(MIN_COLUMNS, _power_of_two_at_least(2 * end + 1))
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                if old is None:
                    continue
                new = old.new_zeros((slots, old.shape[1], columns, old.shape[3]))
                new[: self.size, :, begin:end] = old[: self.size, :, self.begin : self.end]
                buffers[layer] = new
        shift = begin - self.begin
        self.spans = [(a + shift, b + shift, t + shift) for a, b, t in self.spans]
        self.slots, self.columns = slots, columns
        self.begin, self.end = begin, end
        self._build_table()

    def _build_table(self) -> None:
        if not self.size:
            self.table = None
            return
        prefix_begin, prefix_end, tail = torch.tensor(self.spans, device=self.device).T[:, :, None]
        column = torch.arange(self.columns, device=self.device)[None, :]
        allowed = (column >= tail) | ((column >= prefix_begin) & (column < prefix_end))
        # additive, one row per KV head: what _decode_attention adds to the scores, sliced
        # per step without a copy
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        additive = zero.masked_fill(~allowed, torch.finfo(self.dtype).min)
        self.table = additive[:, None, None, :].expand(-1, self.kv_heads, 1, -1).contiguous()

    def _mask_values(self, allowed: torch.Tensor) -> torch.Tensor:
        if not self.additive_mask:
            return allowed
        # eager attention adds the mask to the scores
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return zero.masked_fill(~allowed, torch.finfo(self.dtype).min)


def _first_column(span: tuple[int, int, int]) -> int:
    prefix_begin, prefix_end, tail = span
    return prefix_begin if prefix_begin < prefix_end else tail


def _common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    if len(sequences) < 2:
        return 0
    length = min(len(s) for s in sequences)
    first = sequences[0]
    for other in sequences[1:]:
        while length and tuple(other[:length]) != tuple(first[:length]):
            length -= 1
    return length


class DynamicKV:
    """The model's own ``DynamicCache`` with 2D masks, for models :class:`SlotKV` cannot
    serve: rows join only when the running batch is empty (one prompt pass for all of them),
    and rows that finish leave it."""

    merges = False

    def __init__(
        self,
        model: Any,
        *,
        device: torch.device,
        pad_token_id: int,
        vision: Any = None,
        **_: Any,
    ) -> None:
        self.config = model.config
        self.pad_token_id = pad_token_id
        self.device = device
        self.vision = vision
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None
        self.size = 0

    def prefill_with_images(
        self,
        model: Any,
        prefixes: Sequence[Sequence[int]],
        counts: Sequence[int],
        images: Sequence[Any],
    ) -> tuple[list[int], list[int]]:
        """:meth:`prefill` for a vision-language model: the prefixes' image inputs go to the
        prompt pass, with the positions the model family computes for them (M-RoPE's three
        rows); returns the row order and, for each prefix, the position of the token after
        it (the largest position plus one, as text continues after images)."""
        assert self.size == 0, "rows join a DynamicKV batch only when it is empty"
        assert self.vision is not None
        order = [g for g, count in enumerate(counts) for _ in range(count)]
        ids, mask = left_pad(prefixes, self.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = self.vision.position_ids(ids, mask, list(images))
        self.cache = DynamicCache(config=self.config.get_text_config(decoder=True))
        model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions.transpose(0, 1),
            **model_inputs(list(images), self.device),
            **_with_cache(model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        index = torch.tensor(order, device=self.device)
        if len(order) != len(prefixes):
            self.cache.batch_select_indices(index)
        self.mask = mask[index]
        self.size = len(order)
        next_positions = (positions.amax(dim=(1, 2)) + 1).tolist()
        return order, [int(p) for p in next_positions]

    def prefill(self, model: Any, prefixes: Sequence[Sequence[int]], counts: Sequence[int]):
        assert self.size == 0, "rows join a DynamicKV batch only when it is empty"
        order = [g for g, count in enumerate(counts) for _ in range(count)]
        width = max((len(p) for p in prefixes), default=0)
        ids, mask = left_pad(prefixes, self.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        self.cache = DynamicCache(config=self.config)
        if width:
            positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                **_with_cache(model, self.cache),
                use_cache=True,
                logits_to_keep=1,
            )
        index = torch.tensor(order, device=self.device)
        if width and len(order) != len(prefixes):
            self.cache.batch_select_indices(index)
        self.mask = mask[index]
        self.size = len(order)
        return order

    def forward_step(
        self, model: Any, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.size, 1))], dim=-1)
        output = model(
            input_ids=input_ids[:, None],
            attention_mask=self.mask,
            position_ids=positions[:, None],
            **_with_cache(model, self.cache),
            use_cache=True,
        )
        return output.logits[:, -1, :]

    def remove(self, drop: Sequence[int]) -> list[int]:
        dropped = set(drop)
        order = [i for i in range(self.size) if i not in dropped]
        self.size = len(order)
        if not order:
            self.reset()
            return order
        assert self.cache is not None and self.mask is not None
        index = torch.tensor(order, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        # cut cache columns that are padding for every remaining row (plain layers only)
        lead = int(self.mask.any(dim=0).to(torch.int8).argmax())
        if lead and all(type(layer) is DynamicLayer for layer in self.cache.layers):
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.keys = layer.keys[:, :, lead:]
                    layer.values = layer.values[:, :, lead:]
            self.mask = self.mask[:, lead:]
        return order

    def weights_changed(self) -> None:
        """Nothing here copies the weights."""

    def reset(self, *, free: bool = False) -> None:
        self.cache = None
        self.mask = None
        self.size = 0
