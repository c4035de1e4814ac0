"""The hf engine's memory terms (the ``estimate_memory`` hook). docs/plan.md explains each.

No torch here: the estimate runs before anything is imported or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import (
    MemoryTerm,
    ModelShape,
    PlanContext,
    dtype_bytes,
    engine_phases,
    engine_rows,
    forward_working_set,
    kv_cache_bytes,
    logits_bytes,
    rollout_dtype,
    sharded,
)

if TYPE_CHECKING:
    from plugrl.api import Recipe

# lean decoding serves these model types from fused copies of their weights
LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3")


KV_MIN_COLUMNS = 64
"""The fewest columns a KV buffer has (``plugrl_hf.kv.MIN_COLUMNS``)."""


def buffer_columns(sequence_length: int) -> int:
    """Columns of the KV buffers once a window of ``sequence_length`` tokens has grown in
    them: the smallest power of two above twice the window (measured on the CPU by
    bench/bench_memory_plan.py: 256 columns for 80 tokens, 512 for 192)."""
    return max(KV_MIN_COLUMNS, 1 << (2 * sequence_length).bit_length())


def shard_parameters(shape: ModelShape, tensor_parallel: int) -> int:
    """Parameters one device of an engine split over ``tensor_parallel`` devices holds
    (:mod:`plugrl_hf.tensor_parallel`): its share of each layer's attention heads and MLP
    width (the projections and q/k/v biases), and the embeddings, the head and the norms
    whole."""
    bias = (shape.attention_width + 2 * shape.kv_width) if shape.qkv_bias else 0
    split = shape.layer_linear_parameters() + bias
    per_layer = sharded(split, tensor_parallel) + 2 * shape.hidden_size
    return shape.num_layers * per_layer + shape.embedding_parameters() + shape.hidden_size


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """The terms of one hf engine's device, or None when the recipe's engine is another."""
    if role != "rollout" or recipe.rollout.engine != "hf":
        return None
    config = recipe.rollout
    dtype = rollout_dtype(recipe)
    e = dtype_bytes(dtype)
    tp = config.tensor_model_parallel_size
    phases = engine_phases(recipe, context)
    rows = engine_rows(recipe, context)
    terms = []
    # a colocated engine in the trainer's process copies the trainer's weights (FSDP's module
    # is not servable as it is); on engine workers it loads its own; both in rollout.dtype.
    # A split engine (tensor parallel, on Ray) always loads its own shard.
    own_weights = (
        tp > 1
        or not context.colocated
        or config.copy_trainer_weights
        or dtype != recipe.model.dtype
    )
    if own_weights:
        held = shard_parameters(shape, tp)
        split = f", the heads and MLP split over tensor_model_parallel_size={tp}" if tp > 1 else ""
        terms.append(
            MemoryTerm(
                "engine weights",
                held * e,
                phases,
                "rollout",
                note=f"{held:,} x {e} B ({dtype}){split}",
            )
        )
        # a split engine decodes with its own forward, without lean_decode's fused copies
        if config.lean_decode and tp == 1:
            fused = (
                shape.num_layers
                * shape.hidden_size
                * (shape.attention_width + 2 * shape.kv_width + 2 * shape.intermediate_size)
            )
            terms.append(
                MemoryTerm(
                    "fused decode weights",
                    fused * e,
                    phases,
                    "rollout",
                    note="lean_decode: q/k/v and gate/up projections held a second time, fused",
                )
            )
    # the cache's buffers (plugrl_hf.kv.SlotKV) have a power-of-two column count at least
    # twice the window they hold plus one, so a full-length window sits in 2-4x its tokens
    columns = buffer_columns(context.sequence_length)
    kv = kv_cache_bytes(shape, rows * columns, e, tp)
    terms.append(
        MemoryTerm(
            "KV cache",
            kv,
            phases,
            "rollout",
            note=f"{rows} sequences x {columns:,} buffer columns for "
            f"{context.sequence_length:,} tokens x 2 L k x {e} B",
        )
    )
    terms.append(
        MemoryTerm(
            "KV cache growth",
            kv // (2 * shape.num_layers),
            ("generate",),
            "rollout",
            note="buffers are reallocated one layer at a time: that layer's old pair, half "
            "as wide, is held beside the new one",
            instant="decode",
        )
    )
    terms.append(
        MemoryTerm(
            "decode logits",
            logits_bytes(shape, rows, e + 4 + 4),
            ("generate",),
            "rollout",
            note=f"{rows} rows x V: logits, float32 copy, sampling probabilities",
            instant="decode",
        )
    )
    prefill = min(config.max_prefill_tokens, rows * recipe.data.max_prompt_length)
    terms.append(
        MemoryTerm(
            "prompt pass",
            forward_working_set(shape, prefill, e),
            ("generate",),
            "rollout",
            note=f"max_prefill_tokens: {prefill:,} prompt tokens in one forward",
            instant="prompt pass",
        )
    )
    return terms
