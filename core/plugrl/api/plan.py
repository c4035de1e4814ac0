"""Memory planning for plugins: the data a plugin's ``estimate_memory`` hook returns, what it
gets, and the shared formulas its terms are built from (docs/plan.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.algorithms.log_prob_chunks import chunk_tokens as log_prob_chunk_tokens
    from plugrl.plan.context import MicroBatch, PlanContext
    from plugrl.plan.formulas import (
        ADAM_STATES,
        activation_bytes_per_token_layer,
        computes_entropy,
        engine_phases,
        engine_rows,
        forward_working_set,
        kv_cache_bytes,
        logits_bytes,
        reserved_engine_terms,
        rollout_dtype,
        sharded,
        training_activations,
    )
    from plugrl.plan.shape import ModelShape
    from plugrl.plan.terms import GIB, MIB, PHASES, MemoryTerm, dtype_bytes

__all__ = [
    "ADAM_STATES",
    "GIB",
    "MIB",
    "PHASES",
    "MemoryTerm",
    "MicroBatch",
    "ModelShape",
    "PlanContext",
    "activation_bytes_per_token_layer",
    "computes_entropy",
    "dtype_bytes",
    "engine_phases",
    "engine_rows",
    "forward_working_set",
    "kv_cache_bytes",
    "log_prob_chunk_tokens",
    "logits_bytes",
    "reserved_engine_terms",
    "rollout_dtype",
    "sharded",
    "training_activations",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "ADAM_STATES": ("plugrl.plan.formulas", "ADAM_STATES"),
        "GIB": ("plugrl.plan.terms", "GIB"),
        "MIB": ("plugrl.plan.terms", "MIB"),
        "PHASES": ("plugrl.plan.terms", "PHASES"),
        "MemoryTerm": ("plugrl.plan.terms", "MemoryTerm"),
        "MicroBatch": ("plugrl.plan.context", "MicroBatch"),
        "ModelShape": ("plugrl.plan.shape", "ModelShape"),
        "PlanContext": ("plugrl.plan.context", "PlanContext"),
        "activation_bytes_per_token_layer": (
            "plugrl.plan.formulas",
            "activation_bytes_per_token_layer",
        ),
        "computes_entropy": ("plugrl.plan.formulas", "computes_entropy"),
        "dtype_bytes": ("plugrl.plan.terms", "dtype_bytes"),
        "engine_phases": ("plugrl.plan.formulas", "engine_phases"),
        "engine_rows": ("plugrl.plan.formulas", "engine_rows"),
        "forward_working_set": ("plugrl.plan.formulas", "forward_working_set"),
        "kv_cache_bytes": ("plugrl.plan.formulas", "kv_cache_bytes"),
        "log_prob_chunk_tokens": ("plugrl.algorithms.log_prob_chunks", "chunk_tokens"),
        "logits_bytes": ("plugrl.plan.formulas", "logits_bytes"),
        "reserved_engine_terms": ("plugrl.plan.formulas", "reserved_engine_terms"),
        "rollout_dtype": ("plugrl.plan.formulas", "rollout_dtype"),
        "sharded": ("plugrl.plan.formulas", "sharded"),
        "training_activations": ("plugrl.plan.formulas", "training_activations"),
    },
)
