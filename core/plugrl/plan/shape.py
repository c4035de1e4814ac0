"""A model's shape, read from its ``config.json`` without loading a weight.

The shape is what the memory terms need: the width, depth and head counts that size the
weights, the activations and the KV cache, and the vocabulary that sizes the logits. A few
public shapes ship with plugrl (``qwen2.5-7b``, ``qwen2.5-32b``, ``llama-3-70b``, ...), with the
numbers of their published ``config.json``, so that a machine without the model can plan it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugrl.errors import RecipeError

SHAPES_FOLDER = Path(__file__).parent / "shapes"

_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# model types whose attention projections q, k, v carry a bias when the config does not say
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
# suffixes of a hub name that do not change the shape (Qwen2.5-7B-Instruct is Qwen2.5-7B's)
_NAME_SUFFIXES = re.compile(r"(-(instruct|chat|base|it|hf))+$")


@attrs.frozen
class ModelShape:
    """The sizes of a dense decoder-only transformer (Llama / Qwen2 / Qwen3 family)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False

    @property
    def attention_width(self) -> int:
        """Query width: heads x head size (the hidden size for most models)."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Key (or value) width: kv heads x head size."""
        return self.num_kv_heads * self.head_dim

    def layer_linear_parameters(self) -> int:
        """Weights of one layer's linear projections (q, k, v, o, gate, up, down), no bias."""
        h = self.hidden_size
        attention = h * self.attention_width * 2 + h * self.kv_width * 2
        return attention + 3 * h * self.intermediate_size

    def layer_parameters(self) -> int:
        """One layer's parameters: projections, q/k/v biases if any, two norms."""
        bias = (self.attention_width + 2 * self.kv_width) if self.qkv_bias else 0
        return self.layer_linear_parameters() + bias + 2 * self.hidden_size

    def embedding_parameters(self) -> int:
        """Input embedding plus the output head (once when they are tied)."""
        table = self.vocab_size * self.hidden_size
        return table if self.tie_word_embeddings else 2 * table

    def parameters(self) -> int:
        """All parameters: layers, embeddings, the final norm."""
        return (
            self.num_layers * self.layer_parameters()
            + self.embedding_parameters()
            + self.hidden_size
        )

    def largest_layer_parameters(self) -> int:
        """The largest unit FSDP gathers at once: a decoder layer or the vocabulary table."""
        return max(self.layer_parameters(), self.vocab_size * self.hidden_size)

    def lora_parameters(self, rank: int, target_modules: str | list[str] = "all-linear") -> int:
        """Adapter parameters at ``rank``: ``rank x (in + out)`` per adapted projection.
        ``all-linear`` adapts the seven projections of every layer; a list adapts the named
        ones (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); a regular
        expression is counted as all-linear, the largest it can be."""
        h, i = self.hidden_size, self.intermediate_size
        sizes = {
            "q_proj": h + self.attention_width,
            "k_proj": h + self.kv_width,
            "v_proj": h + self.kv_width,
            "o_proj": self.attention_width + h,
            "gate_proj": h + i,
            "up_proj": h + i,
            "down_proj": i + h,
        }
        if isinstance(target_modules, list):
            chosen = [sizes[name] for name in target_modules if name in sizes]
        else:
            chosen = list(sizes.values())
        return self.num_layers * rank * sum(chosen)


def shape_from_config(config: Mapping[str, Any], name: str, source: str) -> ModelShape:
    """A :class:`ModelShape` from the fields of a ``config.json``; ``source`` names the file
    in the one-line error a missing field or a mixture-of-experts model gives."""
    if isinstance(config.get("text_config"), Mapping):  # a multimodal model's language part
        config = config["text_config"]
    moe = [key for key in _MOE_KEYS if config.get(key)]
    if moe:
        raise RecipeError(
            f"{source} describes a mixture-of-experts model ({moe[0]}={config[moe[0]]}): its "
            "memory is not estimated yet; plan a dense model, or set trainer.memory_check=off",
            key="model.path",
        )
    missing = [
        key
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
        if not isinstance(config.get(key), int)
    ]
    if missing:
        raise RecipeError(
            f"{source} lacks {', '.join(missing)} (or they are not integers): give a "
            "decoder-only model's config.json (--model-config PATH)",
            key="model.path",
        )
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    bias = config.get("attention_bias")
    if bias is None:
        bias = config.get("model_type") in _QKV_BIAS_TYPES
    return ModelShape(
        name=name,
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(bias),
    )


def named_shapes() -> dict[str, Path]:
    """The shipped shapes by name (``qwen2.5-7b``)."""
    return {path.stem: path for path in sorted(SHAPES_FOLDER.glob("*.json"))}


def read_config_file(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or a one-line error naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read {path}: {exc.strerror or exc}", key="model.path") from None
    except json.JSONDecodeError as exc:
        raise RecipeError(
            f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); give the model's "
            "config.json",
            key="model.path",
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path} does not hold a JSON object", key="model.path")
    return data


def shape_name(path: str) -> str | None:
    """The shipped shape a model path or hub name stands for (``Qwen/Qwen2.5-7B-Instruct``
    and ``models/qwen2.5-7b`` are ``qwen2.5-7b``), or None."""
    base = _NAME_SUFFIXES.sub("", Path(str(path).rstrip("/")).name.lower())
    base = base.replace("meta-llama-", "llama-").replace("llama-3.1-", "llama-3-")
    return base if base in named_shapes() else None


def read_shape(path: str | Path, config_override: Mapping[str, Any] | None = None) -> ModelShape:
    """The shape of the model at ``path``: a model folder (its ``config.json``), a
    ``config.json`` file, or a shipped shape's name, in that order. ``config_override``
    (``model.override_config``) is applied to the fields read."""
    candidate = Path(path)
    if candidate.is_dir():
        file = candidate / "config.json"
        if not file.is_file():
            raise RecipeError(
                f"{candidate} has no config.json; give a model folder, a config.json "
                "(--model-config PATH) or a shipped shape "
                f"({', '.join(named_shapes())})",
                key="model.path",
            )
    elif candidate.is_file():
        file = candidate
    else:
        name = shape_name(str(path))
        if name is None:
            raise RecipeError(
                f"{path} is neither a model folder here nor a shipped shape; give "
                f"--model-config PATH or one of {', '.join(named_shapes())}",
                key="model.path",
            )
        return shape_from_config(
            {**read_config_file(named_shapes()[name]), **(config_override or {})},
            name,
            f"shape {name}",
        )
    config = {**read_config_file(file), **(config_override or {})}
    label = candidate.name if candidate.is_dir() else candidate.parent.name or candidate.name
    return shape_from_config(config, label, str(file))
