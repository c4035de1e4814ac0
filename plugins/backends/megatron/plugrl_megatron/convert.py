"""Hugging Face <-> megatron-core weights and model settings for the dense Qwen families.

Megatron fuses what Hugging Face keeps apart: ``linear_qkv`` holds q, k and v interleaved per
query group (``[q of the group's heads, k, v]`` for each key-value head), and ``linear_fc1``
holds the gate projection above the up projection. Tensors here are whole (unsharded); the
tensor-parallel split is :mod:`plugrl_megatron.sharding`'s business.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from plugrl.api import RecipeError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""``model.dtype`` names."""

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")
"""``config.json`` ``model_type`` values this backend converts (dense models only)."""

_LAYER = "decoder.layers.{}."


def check_supported(hf_config: Any, key: str = "model.path") -> None:
    """Refuse, in one line, a model family whose weights this backend cannot convert."""
    model_type = getattr(hf_config, "model_type", None)
    if getattr(hf_config, "vision_config", None) is not None:
        raise RecipeError(
            f"model type {model_type!r} is a vision-language model, which the megatron backend "
            "does not train; use actor.backend: fsdp2 for this model",
            key=key,
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise RecipeError(
            f"model type {model_type!r} is not supported by the megatron backend (it converts "
            f"{' and '.join(SUPPORTED_MODEL_TYPES)} dense models; Llama, Mistral, Gemma, "
            "DeepSeek and mixture-of-experts models are not converted yet); use "
            "actor.backend: fsdp2 for this model",
            key=key,
        )


def head_dim(hf_config: Any) -> int:
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit or hf_config.hidden_size // hf_config.num_attention_heads)


def transformer_settings(hf_config: Any) -> dict[str, Any]:
    """``TransformerConfig`` fields that describe the Hugging Face model's network."""
    check_supported(hf_config)
    qwen3 = hf_config.model_type == "qwen3"
    return {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": hf_config.num_attention_heads,
        "num_query_groups": hf_config.num_key_value_heads,
        "kv_channels": head_dim(hf_config),
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        # Qwen2 has q/k/v biases; Qwen3 drops them for q/k layer norms
        "add_qkv_bias": not qwen3,
        "qk_layernorm": qwen3,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        # the fused kernels these switch on are CUDA-only; the unfused paths compute the same
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
    }


def model_settings(hf_config: Any) -> dict[str, Any]:
    """``GPTModel`` arguments that describe the Hugging Face model."""
    rope_theta = getattr(hf_config, "rope_theta", None)
    if rope_theta is None:  # transformers 5 keeps it in rope_parameters
        rope_theta = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    return {
        "vocab_size": hf_config.vocab_size,
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(rope_theta),
        "share_embeddings_and_output_weights": bool(hf_config.tie_word_embeddings),
    }


def _hf_layer_names(hf_config: Any, layer: int) -> list[str]:
    prefix = f"model.layers.{layer}."
    attention = [f"self_attn.{p}_proj.weight" for p in "qkv"]
    if hf_config.model_type == "qwen2":
        attention += [f"self_attn.{p}_proj.bias" for p in "qkv"]
    else:
        attention += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    names = [
        "input_layernorm.weight",
        *attention,
        "self_attn.o_proj.weight",
        "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    return [prefix + name for name in names]


def megatron_names(hf_config: Any) -> list[str]:
    """Every megatron parameter name of the whole model (global layer numbers), in the order
    weights are sent."""
    names = ["embedding.word_embeddings.weight"]
    for layer in range(hf_config.num_hidden_layers):
        prefix = _LAYER.format(layer)
        attention = ["self_attention.linear_qkv.weight"]
        if hf_config.model_type == "qwen2":
            attention.append("self_attention.linear_qkv.bias")
        else:
            attention += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
        layer_names = [
            "input_layernorm.weight",
            *attention,
            "self_attention.linear_proj.weight",
            "pre_mlp_layernorm.weight",
            "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight",
        ]
        names += [prefix + name for name in layer_names]
    names.append("decoder.final_layernorm.weight")
    if not hf_config.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def hf_names(hf_config: Any) -> list[str]:
    """Every Hugging Face weight name, in the order :func:`to_hf` produces them (a tied
    ``lm_head.weight`` is left out: it is ``model.embed_tokens.weight``)."""
    names = ["model.embed_tokens.weight"]
    for layer in range(hf_config.num_hidden_layers):
        names += _hf_layer_names(hf_config, layer)
    names.append("model.norm.weight")
    if not hf_config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def hf_shapes(hf_config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, whole shape)`` of every weight :func:`hf_names` lists, from the config alone."""
    hidden, vocab = hf_config.hidden_size, hf_config.vocab_size
    size = head_dim(hf_config)
    q_out = hf_config.num_attention_heads * size
    kv_out = hf_config.num_key_value_heads * size
    ffn = hf_config.intermediate_size
    by_suffix = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_out, hidden),
        "self_attn.k_proj.weight": (kv_out, hidden),
        "self_attn.v_proj.weight": (kv_out, hidden),
        "self_attn.q_proj.bias": (q_out,),
        "self_attn.k_proj.bias": (kv_out,),
        "self_attn.v_proj.bias": (kv_out,),
        "self_attn.q_norm.weight": (size,),
        "self_attn.k_norm.weight": (size,),
        "self_attn.o_proj.weight": (hidden, q_out),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (ffn, hidden),
        "mlp.up_proj.weight": (ffn, hidden),
        "mlp.down_proj.weight": (hidden, ffn),
    }
    top = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    shapes = []
    for name in hf_names(hf_config):
        if name in top:
            shapes.append((name, top[name]))
        else:
            shapes.append((name, by_suffix[name.split(".", 3)[3]]))
    return shapes


def _split_layer_name(name: str) -> tuple[int | None, str]:
    if not name.startswith("decoder.layers."):
        return None, name
    layer, _, rest = name.removeprefix("decoder.layers.").partition(".")
    return int(layer), rest


def _qkv_shapes(hf_config: Any) -> tuple[int, int, int]:
    """(key-value heads, query heads per key-value head, head size)."""
    groups = hf_config.num_key_value_heads
    return groups, hf_config.num_attention_heads // groups, head_dim(hf_config)


def fuse_qkv(hf_config: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Hugging Face q, k, v (weights ``[heads*d, hidden]`` or biases ``[heads*d]``) as
    megatron's ``linear_qkv``: per key-value group, its query heads, then k, then v."""
    groups, per_group, size = _qkv_shapes(hf_config)
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(groups, per_group * size, *rest),
            k.reshape(groups, size, *rest),
            v.reshape(groups, size, *rest),
        ],
        dim=1,
    )
    return fused.reshape(-1, *rest)


def split_qkv(hf_config: Any, fused: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of :func:`fuse_qkv`."""
    groups, per_group, size = _qkv_shapes(hf_config)
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * size, *rest)
    q, k, v = grouped.split([per_group * size, size, size], dim=1)
    return (
        q.reshape(-1, *rest).contiguous(),
        k.reshape(-1, *rest).contiguous(),
        v.reshape(-1, *rest).contiguous(),
    )


_PLAIN = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def hf_sources(hf_config: Any, name: str) -> list[str]:
    """The Hugging Face weights one whole megatron weight is made of (the output layer of a
    model with tied embeddings is the embedding)."""
    layer, rest = _split_layer_name(name)
    if layer is None:
        if name == "output_layer.weight" and hf_config.tie_word_embeddings:
            return [_TOP["embedding.word_embeddings.weight"]]
        return [_TOP[name]]
    hf = f"model.layers.{layer}."
    if rest.startswith("self_attention.linear_qkv."):
        kind = rest.rpartition(".")[2]
        return [f"{hf}self_attn.{part}_proj.{kind}" for part in "qkv"]
    if rest == "mlp.linear_fc1.weight":
        return [hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"]
    if rest in _PLAIN:
        return [hf + _PLAIN[rest]]
    raise KeyError(f"no Hugging Face weights for megatron weight {name!r}")


def from_hf_weight(hf_config: Any, name: str, sources: list[torch.Tensor]) -> torch.Tensor:
    """One whole megatron weight from the tensors :func:`hf_sources` names, in that order."""
    layer, rest = _split_layer_name(name)
    if layer is not None and rest.startswith("self_attention.linear_qkv."):
        return fuse_qkv(hf_config, *sources)
    if layer is not None and rest == "mlp.linear_fc1.weight":
        return torch.cat(sources, dim=0)
    (tensor,) = sources
    return tensor


def from_hf(hf_config: Any, hf_weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole megatron weights (global layer numbers) from a Hugging Face state dict."""
    check_supported(hf_config)
    return {
        name: from_hf_weight(
            hf_config, name, [hf_weights[source] for source in hf_sources(hf_config, name)]
        )
        for name in megatron_names(hf_config)
    }


def to_hf(hf_config: Any, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The Hugging Face weights one whole megatron weight stands for."""
    layer, rest = _split_layer_name(name)
    if layer is None:
        yield _TOP[name], tensor
        return
    hf = f"model.layers.{layer}."
    if rest in _PLAIN:
        yield hf + _PLAIN[rest], tensor
    elif rest.startswith("self_attention.linear_qkv."):
        kind = rest.rpartition(".")[2]
        for part, piece in zip("qkv", split_qkv(hf_config, tensor), strict=True):
            yield f"{hf}self_attn.{part}_proj.{kind}", piece
    elif rest == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        yield hf + "mlp.gate_proj.weight", gate.contiguous()
        yield hf + "mlp.up_proj.weight", up.contiguous()
    else:
        raise KeyError(f"no Hugging Face name for megatron weight {name!r}")
