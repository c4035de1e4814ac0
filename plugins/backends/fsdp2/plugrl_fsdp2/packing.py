"""Packed forwards: the attended tokens of a micro-batch's rows laid end to end in one row.

A packed micro-batch has no padding: the linear layers, the norms and the MLP run on the real
tokens only. Each row keeps its own positions (the batch's ``position_ids``) and attention
never crosses from one row into another: the model runs with the ``plugrl_varlen`` attention
implementation (:func:`varlen_attention`), which reads the row boundaries from the
``cu_seq_lens_q``/``cu_seq_lens_k`` keyword arguments that Hugging Face models pass through to
their attention function.

Where the device has flash-attention's variable-length kernel (CUDA with ``flash-attn``
installed, half-precision compute) the boundaries go to it directly. Elsewhere (CPU, float32,
or no ``flash-attn``) the queries, keys and values alone are spread back into one right-padded
row per sequence for a causal ``scaled_dot_product_attention`` and gathered again: a query
attends its own row's earlier tokens, all real, so padding is never attended and no mask is
needed, and the padded work is only the attention product itself.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

ATTENTION = "plugrl_varlen"
"""The name :func:`varlen_attention` is registered under in transformers' attention
interface (a model's ``config._attn_implementation``)."""


@attrs.frozen
class Packing:
    """One micro-batch of ``b`` rows of ``[P + R]`` columns, packed.

    * ``token_index`` [T]: for each packed token, its flat index in the ``[b, P + R]`` batch
      (row-major), so ``input_ids.flatten()[token_index]`` are the packed ids.
    * ``cu_seq_lens`` [b + 1] int32: where each row starts and ends in the packed row.
    * ``max_length``: the longest row.
    * ``keep`` [K]: the packed positions whose outputs predict a response token (the model's
      ``logits_to_keep``), in packed order.
    * ``response_index`` [b, R']: for each response column ``j`` of each row, the index among
      ``keep`` of the output that predicts it; ``R'`` is the longest response in use. Columns a
      row does not use point at some kept output: their values must be masked by the caller.
    """

    token_index: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    keep: torch.Tensor
    response_index: torch.Tensor

    @property
    def response_len(self) -> int:
        return int(self.response_index.shape[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_index.shape[0])

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """``values [b, P + R]`` (token ids, positions) as one packed row ``[1, T]``;
        positions with several rows per token ``[b, k, P + R]`` (M-RoPE) as ``[k, 1, T]``,
        the layout the model takes them in."""
        if values.dim() == 3:
            rows = values.transpose(0, 1).reshape(values.shape[1], -1)
            return rows[:, self.token_index][:, None, :]
        return values.reshape(-1)[self.token_index][None, :]

    def attention_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that carry the row boundaries to the attention function (the
        names transformers' flash-attention path reads)."""
        return {
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def pack(attention_mask: torch.Tensor, response_width: int) -> Packing:
    """The :class:`Packing` of ``[b, P + R]`` rows whose responses start at column ``P``.

    The attended columns of each row, prompt then response, become that row's packed tokens.
    The output that predicts response column ``P + j`` is the one at column ``P + j - 1``;
    every row keeps at least the output of its last prompt column (``R' >= 1``), so no shape is
    ever empty.
    """
    rows, total = attention_mask.shape
    prompt_width = total - response_width
    device = attention_mask.device
    attended = attention_mask.bool()
    flat = attended.reshape(-1)
    token_index = flat.nonzero().squeeze(-1)
    lengths = attended.sum(dim=1)
    cu_seq_lens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    max_length = int(lengths.max()) if rows else 0
    # packed position of every attended column (garbage where not attended)
    packed_position = (flat.long().cumsum(0) - 1).reshape(rows, total)
    response_attended = attended[:, prompt_width:]
    has_response = response_attended.any(dim=1)
    last_response = response_width - 1 - response_attended.flip(1).int().argmax(dim=1)
    response_len = int(torch.where(has_response, last_response + 1, 1).max()) if rows else 1
    response_len = max(response_len, 1)
    # columns P-1 .. P+R'-2 predict response columns P .. P+R'-1
    predictors = slice(prompt_width - 1, prompt_width - 1 + response_len)
    kept = attended[:, predictors]
    keep = packed_position[:, predictors][kept]
    if keep.numel() == 0:  # no row has a prompt token: keep one output so shapes stay valid
        keep = torch.zeros(1, dtype=torch.long, device=device)
    response_index = (kept.reshape(-1).long().cumsum(0) - 1).reshape(rows, response_len)
    response_index = response_index.clamp(min=0)
    return Packing(token_index, cu_seq_lens, max_length, keep, response_index)


def _flash_varlen() -> Any:
    """flash-attention's variable-length kernel when the ``flash-attn`` package is installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _padded_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scaling: float | None,
) -> torch.Tensor:
    """Causal attention of packed ``[1, heads, T, d]`` tensors, one right-padded row per
    sequence; returns ``[1, T, heads, d]`` as transformers' attention functions do."""
    starts = cu_seq_lens[:-1].long()
    lengths = cu_seq_lens.diff().long()
    rows = lengths.shape[0]
    total = query.shape[2]
    row_of_token = torch.repeat_interleave(torch.arange(rows, device=query.device), lengths)
    offset = torch.arange(total, device=query.device) - starts[row_of_token]
    padded_index = row_of_token * max_length + offset

    def spread(packed: torch.Tensor) -> torch.Tensor:
        heads, dim = packed.shape[1], packed.shape[3]
        tokens = packed[0].transpose(0, 1)  # [T, heads, d]
        out = tokens.new_zeros(rows * max_length, heads, dim)
        out = out.index_copy(0, padded_index, tokens)
        return out.reshape(rows, max_length, heads, dim).transpose(1, 2)

    q, k, v = spread(query), spread(key), spread(value)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    # right padding only: a real query's causal window holds real keys of its own row
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
    out = out.transpose(1, 2).reshape(rows * max_length, q.shape[1], v.shape[-1])
    return out[padded_index][None]


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed row (``cu_seq_lens_q``), for transformers'
    attention interface. Without row boundaries (a forward that is not packed, such as
    generation from the live training model) it is transformers' ``sdpa`` attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if dropout:
        raise ValueError(
            "packed attention runs without dropout; set the model's attention_dropout to 0 "
            "(model.override_config.attention_dropout) or actor.use_remove_padding to false"
        )
    max_length = int(kwargs["max_length_q"])
    # the kernel computes in half precision only; float32 takes the SDPA path
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        flash = _flash_varlen()
        if flash is not None:
            tokens = [t[0].transpose(0, 1) for t in (query, key, value)]  # [T, heads, d]
            out = flash(
                *tokens,
                cu_seq_lens,
                cu_seq_lens,
                max_length,
                max_length,
                softmax_scale=scaling,
                causal=True,
            )
            return out[None], None
    out = _padded_attention(query, key, value, cu_seq_lens, max_length, scaling)
    return out, None


def register() -> None:
    """Make :data:`ATTENTION` a valid ``attn_implementation`` (idempotent). No mask function
    is registered with it, so models build no attention mask for it: the row boundaries are
    the mask."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, varlen_attention)


def unpackable_reason(config: Any) -> str | None:
    """Why a model with this Hugging Face ``config`` cannot run packed, or None when it can:
    attention other than full causal attention in every layer (sliding windows) has no
    packed form here."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    others = sorted(set(layer_types) - {"full_attention"})
    if others:
        return f"its layers use {', '.join(others)}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "it uses sliding-window attention"
    return None
