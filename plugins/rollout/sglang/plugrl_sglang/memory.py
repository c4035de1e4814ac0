"""The sglang engine's memory terms (the ``estimate_memory`` hook). docs/plan.md explains each.

SGLang's ``mem_fraction_static`` is ``gpu_memory_utilization``: the static pool (weights and
KV cache) it takes of the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import GIB, MemoryTerm, ModelShape, PlanContext, reserved_engine_terms

if TYPE_CHECKING:
    from plugrl.api import Recipe

CUDA_GRAPHS_ALLOWANCE = GIB
"""Captured decode graphs: an allowance; enforce_eager (disable_cuda_graph) captures none."""
CHUNKED_PREFILL_TOKENS = 8192
"""The prefill chunk counted when max_num_batched_tokens is unset (SGLang picks per device)."""


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    if role != "rollout" or recipe.rollout.engine != "sglang":
        return None
    config = recipe.rollout
    graphs = 0 if config.enforce_eager else CUDA_GRAPHS_ALLOWANCE
    if config.enable_chunked_prefill:
        tokens = config.max_num_batched_tokens or CHUNKED_PREFILL_TOKENS
    else:
        tokens = recipe.data.max_prompt_length
    return reserved_engine_terms(recipe, shape, context, "rollout", graphs, tokens)
