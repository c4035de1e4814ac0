"""The judge model's memory terms (the ``estimate_memory`` hook). docs/plan.md explains each.

The judge runs on an engine of its own, on devices of its own: its weights in its dtype split
over its tensor parallelism, and the KV cache of the answers it writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import (
    MemoryTerm,
    ModelShape,
    PlanContext,
    dtype_bytes,
    kv_cache_bytes,
    sharded,
)

if TYPE_CHECKING:
    from plugrl.api import Recipe

ALL_PHASES = ("generate", "log_prob", "update")


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """The judge engine's weights and KV cache on one of its devices."""
    if role != "judge" or recipe.reward.manager != "judge":
        return None
    judge = recipe.reward.judge
    judge_shape = context.shape_of(judge.model.path) if judge.model.path else shape
    rollout = judge.rollout
    tp = int(rollout.get("tensor_model_parallel_size", 1))
    dtype = rollout.get("dtype", "auto")
    dtype = "bfloat16" if dtype == "auto" else dtype
    e = dtype_bytes(dtype)
    rows = min(context.rollout_rows, int(rollout.get("max_num_seqs", 1024)))
    # the judge reads the prompt and the response and writes max_tokens
    tokens = rows * (context.sequence_length + judge.max_tokens)
    return [
        MemoryTerm(
            "judge weights",
            sharded(judge_shape.parameters() * e, tp),
            ALL_PHASES,
            "judge",
            note=f"{judge_shape.parameters():,} x {e} B ({dtype}) over TP={tp}",
        ),
        MemoryTerm(
            "judge KV cache",
            kv_cache_bytes(judge_shape, tokens, e, tp),
            ("generate",),
            "judge",
            note=f"{rows} answers x ({context.sequence_length:,} + max_tokens={judge.max_tokens})"
            " tokens",
        ),
    ]
