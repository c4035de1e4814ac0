"""Decode steps and prompt passes of Llama-family models (Llama, Qwen2, Qwen3) written out with
torch functions.

A decode step of the Hugging Face model runs a few hundred small modules per token for a model
of a few layers; at the batch sizes of a rollout on a CPU their Python (module calls, mask and
cache bookkeeping, shape checks) costs as much as a large part of the arithmetic. This step
computes the same thing directly on the module's weights and a key/value store's buffers
(:class:`KVBuffers`, which :class:`plugrl_hf.kv.SlotKV` provides; this module imports nothing
of it, ``kv`` builds the decoder):

* one matrix product for the query, key and value projections and one for the gate and up
  projections of every layer, with their weights concatenated ("fused") once and rebuilt
  whenever any of their parameters changed (an optimizer step or a weight load changes them in
  place, which bumps the tensors' version counters; a new tensor has a new address);
* RMSNorm with :func:`torch.nn.functional.rms_norm`, rotary embedding for queries and keys in
  one operation, the model's own rotary module for the angles (so every RoPE scaling type the
  model supports stays correct), and one batched matrix product per layer for a decode
  step's attention over the masked slot columns.

A prompt pass (rows joining the batch) runs the same way over all its tokens at once, with
``scaled_dot_product_attention`` under the pass's causal mask, and writes only keys and
values: its last layer stops after the key and value projections (the next token's logits
come from the decode step that feeds the prompt's last token). For the quickstart model that
takes 16-25% off the prompt passes of 64 new rows.

It serves only models it can reproduce exactly: the listed model types with SiLU gates,
full-attention layers, plain ``nn.Linear`` projections and plain tensors as weights, and no
forward hooks on any module (adapters and instrumented models run their own forward; the
engine serves a trainer's FSDP module from a plain copy of its weights, see
:mod:`plugrl_hf.engine`). :func:`lean_unsupported` says why a model is not served.

The fused copies hold the query/key/value and gate/up weights a second time: about two thirds
of a small model's weights (10.5 MB beside the quickstart model's 16 MB in float32; 0.47 GB
beside Qwen2.5-0.5B's 0.99 GB in bfloat16). ``rollout.lean_decode: false`` saves that memory.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class KVBuffers(Protocol):
    """What the decoder reads and writes of a key/value store: per layer, key and value
    buffers ``[slots, kv_heads, columns, head_dim]``; the columns ``[begin, end]`` a decode
    step attends to (it writes its token at ``end``) and their additive mask ``table``; and
    ``write``, which stores a prompt pass's keys and values where the store's current target
    says and returns the keys and values those queries attend to."""

    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    begin: int
    end: int
    table: torch.Tensor | None

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_QK_NORM_TYPES = ("qwen3",)


def _hooked(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or getattr(module, "_forward_hooks_with_kwargs", None)
    )


def lean_unsupported(model: Any) -> str | None:
    """Why :class:`LeanDecoder` cannot compute ``model``'s decode steps (``None`` when it can)."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"its activation {config.hidden_act!r} is not silu"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "it splits its projections (pretraining_tp > 1)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return "it has sliding-window layers"
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(model, "lm_head", None), nn.Linear):
        return "it has no model.model and lm_head linear layer"
    if not isinstance(getattr(inner, "embed_tokens", None), nn.Embedding):
        return "its embedding is not a plain nn.Embedding"
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        linears = (
            attention.q_proj,
            attention.k_proj,
            attention.v_proj,
            attention.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
        if any(type(linear) is not nn.Linear for linear in linears):
            return "its projections are not plain nn.Linear layers (an adapter?)"
    for parameter in model.parameters():
        if type(parameter.data) is not torch.Tensor:
            return f"its weights are {type(parameter.data).__name__}, not plain tensors"
    return _hooks_in(list(model.modules()))


def _hooks_in(modules: list[nn.Module]) -> str | None:
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return "global module forward hooks are registered"
    if any(_hooked(module) for module in modules):
        return "its modules have forward hooks (FSDP, an adapter or instrumentation)"
    return None


def _rms_norm(hidden: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    # HF's RMSNorm computes in float32 and scales after casting back
    normed = F.rms_norm(hidden.float(), hidden.shape[-1:], eps=norm.variance_epsilon)
    return norm.weight * normed.to(hidden.dtype)


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = states.shape[-1] // 2
    rotated = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + rotated * sin


class _FusedLayer(NamedTuple):
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None


class LeanDecoder:
    """Decode steps of one model (see the module docstring); build it only for a model
    :func:`lean_unsupported` accepts."""

    def __init__(self, model: Any) -> None:
        config = model.config
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.qk_norm = config.model_type in _QK_NORM_TYPES
        self.split = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.kv_heads * self.head_dim,
        )
        self.intermediate = config.intermediate_size
        self._sources = [
            tensor
            for layer in self.layers
            for linear in (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
            )
            for tensor in (linear.weight, linear.bias)
            if tensor is not None
        ]
        self._modules = list(model.modules())
        self._stamp: tuple[tuple[int, int], ...] | None = None
        self._fused: list[
            tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]
        ]
        self._fused = []

    def usable(self) -> bool:
        """Whether no forward hook has been added since (hooks expect the model's forward to
        run: FSDP gathers weights in them, instrumentation counts calls)."""
        return _hooks_in(self._modules) is None

    def forget(self) -> None:
        """Drop the fused weights (new weights arrived, or their memory is wanted back); the
        next step fuses them again."""
        self._stamp = None
        self._fused = []

    # ------------------------------------------------------------------------ fused weights

    def _refresh(self) -> None:
        """Rebuild the fused weights when a parameter they copy has changed since."""
        stamp = tuple((tensor.data_ptr(), tensor._version) for tensor in self._sources)
        if stamp == self._stamp:
            return
        fused = []
        with torch.no_grad():
            for layer in self.layers:
                attention, mlp = layer.self_attn, layer.mlp
                projections = (attention.q_proj, attention.k_proj, attention.v_proj)
                qkv_weight = torch.cat([p.weight for p in projections])
                qkv_bias = _fused_bias(projections)
                gate_up = (mlp.gate_proj, mlp.up_proj)
                fused.append(
                    _FusedLayer(
                        qkv_weight,
                        qkv_bias,
                        torch.cat([p.weight for p in gate_up]),
                        _fused_bias(gate_up),
                    )
                )
        self._fused = fused
        self._stamp = stamp

    # ------------------------------------------------------------------------ one step

    def decode(
        self, kv: KVBuffers, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Feed one token per row of ``kv`` (its keys and values are written at column
        ``kv.end``); the logits of the next token per row."""
        self._refresh()
        rows = input_ids.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        flat = rows * kv_heads
        begin, end = kv.begin, kv.end
        length = end + 1 - begin
        assert kv.table is not None
        mask = kv.table[:rows, :, :, begin : end + 1].reshape(flat, 1, length)
        hidden = F.embedding(input_ids, self.inner.embed_tokens.weight)
        cos, sin = self.inner.rotary_emb(hidden, positions[:, None])  # [rows, 1, dim]
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            fused = self._fused[index]
            states = F.linear(_rms_norm(hidden, layer.input_layernorm), fused.qkv, fused.qkv_bias)
            query_key = states[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
            value = states[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
            if self.qk_norm:
                query = _rotate(_rms_norm(query_key[:, :heads], attention.q_norm), cos, sin)
                key = _rotate(_rms_norm(query_key[:, heads:], attention.k_norm), cos, sin)
            else:
                query_key = _rotate(query_key, cos, sin)
                query, key = query_key[:, :heads], query_key[:, heads:]
            keys, values = kv.keys[index], kv.values[index]
            assert keys is not None and values is not None
            keys[:rows, :, end] = key
            values[:rows, :, end] = value
            scores = torch.baddbmm(
                mask,
                query.reshape(flat, group, dim),
                keys[:rows, :, begin : end + 1].reshape(flat, length, dim).transpose(1, 2),
                alpha=attention.scaling,
            )
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
            context = torch.bmm(
                weights, values[:rows, :, begin : end + 1].reshape(flat, length, dim)
            )
            output = attention.o_proj
            hidden = hidden + F.linear(
                context.reshape(rows, heads * dim), output.weight, output.bias
            )
            mlp = layer.mlp
            gate_up = F.linear(
                _rms_norm(hidden, layer.post_attention_layernorm), fused.gate_up, fused.gate_up_bias
            )
            gate, up = gate_up.split(self.intermediate, dim=-1)
            down = mlp.down_proj
            hidden = hidden + F.linear(F.silu(gate) * up, down.weight, down.bias)
        hidden = _rms_norm(hidden, self.inner.norm)
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)

    # ------------------------------------------------------------------------ a prompt pass

    def prefill(
        self,
        kv: KVBuffers,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
    ) -> None:
        """Compute the keys and values of ``input_ids`` ``[rows, width]`` into ``kv`` where
        its current target says (:meth:`KVBuffers.write`); ``allowed`` ``[rows, width, keys]``
        says which of the target's columns each query attends to.

        A prompt pass keeps only keys and values (the next token comes from the decode step
        that feeds the prompt's last token), so the last layer stops after its key and value
        projections: its attention, its MLP, the final norm and the head change nothing that
        is kept."""
        self._refresh()
        rows, width = input_ids.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        hidden = F.embedding(input_ids, self.inner.embed_tokens.weight)
        cos, sin = self.inner.rotary_emb(hidden, positions)  # [rows, width, dim]
        cos, sin = cos[:, :, None], sin[:, :, None]
        mask = allowed[:, None]
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            fused = self._fused[index]
            normed = _rms_norm(hidden, layer.input_layernorm)
            if index == last:
                # only the keys and values: the query rows of the fused weight are skipped
                query_rows = heads * dim
                bias = None if fused.qkv_bias is None else fused.qkv_bias[query_rows:]
                states = F.linear(normed, fused.qkv[query_rows:], bias)
                key = states[..., : kv_heads * dim].view(rows, width, kv_heads, dim)
                value = states[..., kv_heads * dim :].view(rows, width, kv_heads, dim)
                if self.qk_norm:
                    key = _rms_norm(key, attention.k_norm)
                kv.write(index, _rotate(key, cos, sin).transpose(1, 2), value.transpose(1, 2))
                break
            states = F.linear(normed, fused.qkv, fused.qkv_bias)
            query_key = states[..., : (heads + kv_heads) * dim].view(
                rows, width, heads + kv_heads, dim
            )
            value = states[..., (heads + kv_heads) * dim :].view(rows, width, kv_heads, dim)
            if self.qk_norm:
                query = _rotate(_rms_norm(query_key[:, :, :heads], attention.q_norm), cos, sin)
                key = _rotate(_rms_norm(query_key[:, :, heads:], attention.k_norm), cos, sin)
            else:
                query_key = _rotate(query_key, cos, sin)
                query, key = query_key[:, :, :heads], query_key[:, :, heads:]
            keys, values = kv.write(index, key.transpose(1, 2), value.transpose(1, 2))
            context = F.scaled_dot_product_attention(
                query.transpose(1, 2),
                keys,
                values,
                attn_mask=mask,
                scale=attention.scaling,
                enable_gqa=kv_heads != heads,
            )
            output = attention.o_proj
            hidden = hidden + F.linear(
                context.transpose(1, 2).reshape(rows, width, heads * dim),
                output.weight,
                output.bias,
            )
            mlp = layer.mlp
            gate_up = F.linear(
                _rms_norm(hidden, layer.post_attention_layernorm), fused.gate_up, fused.gate_up_bias
            )
            gate, up = gate_up.split(self.intermediate, dim=-1)
            down = mlp.down_proj
            hidden = hidden + F.linear(F.silu(gate) * up, down.weight, down.bias)


def _fused_bias(linears: tuple[nn.Linear, ...]) -> torch.Tensor | None:
    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return None
    return torch.cat(
        [
            bias if bias is not None else linear.weight.new_zeros(linear.out_features)
            for linear, bias in zip(linears, biases, strict=True)
        ]
    )
