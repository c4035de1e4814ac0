"""The reward model's memory terms (the ``estimate_memory`` hook). docs/plan.md explains each.

No torch here: the estimate runs before anything is imported or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import MemoryTerm, ModelShape, PlanContext, dtype_bytes, forward_working_set

if TYPE_CHECKING:
    from plugrl.api import Recipe


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """The weights and one scoring forward of the reward model, on its device."""
    if role != "reward_model" or recipe.reward.manager != "reward_model":
        return None
    config = recipe.reward
    model_shape = context.shape_of(config.model.path) if config.model.path else shape
    dtype = "bfloat16" if config.model.dtype == "auto" else config.model.dtype
    e = dtype_bytes(dtype)
    phases = ("generate",) if config.offload else ("generate", "log_prob", "update")
    length = config.max_length or context.sequence_length
    tokens = config.micro_batch_size * length
    return [
        MemoryTerm(
            "reward model weights",
            model_shape.parameters() * e,
            phases,
            "reward_model",
            note=f"{model_shape.parameters():,} x {e} B ({dtype})"
            + ("; in host memory between batches (offload)" if config.offload else ""),
        ),
        MemoryTerm(
            "scoring forward",
            forward_working_set(model_shape, tokens, e),
            ("generate",),
            "reward_model",
            note=f"micro_batch_size={config.micro_batch_size} x {length:,} tokens, no gradient",
            instant="scoring",
        ),
    ]
