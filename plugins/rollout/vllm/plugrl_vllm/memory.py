"""The vllm engine's memory terms (the ``estimate_memory`` hook). docs/plan.md explains each.

vLLM takes ``gpu_memory_utilization`` of the device for its weights, activations, graphs and
KV cache, so with the device's memory known the engine is that reservation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import GIB, MemoryTerm, ModelShape, PlanContext, reserved_engine_terms

if TYPE_CHECKING:
    from plugrl.api import Recipe

CUDA_GRAPHS_ALLOWANCE = GIB
"""Captured decode graphs (one per batch size up to max_num_seqs): an allowance, their size
depends on the model and vLLM's version; enforce_eager captures none."""


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    if role != "rollout" or recipe.rollout.engine != "vllm":
        return None
    config = recipe.rollout
    eager = config.enforce_eager if config.enforce_eager is not None else False
    graphs = 0 if eager else CUDA_GRAPHS_ALLOWANCE
    return reserved_engine_terms(
        recipe, shape, context, "rollout", graphs, config.max_num_batched_tokens
    )
