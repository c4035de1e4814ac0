"""Memory planning for plugins: the data a plugin's ``estimate_memory`` hook returns, what it
gets, and the shared formulas its terms are built from (docs/plan.md)."""

from __future__ import annotations

from plugrl.plan.context import MicroBatch, PlanContext
from plugrl.plan.formulas import (
    ADAM_STATES,
    activation_bytes_per_token_layer,
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
    "dtype_bytes",
    "engine_phases",
    "engine_rows",
    "forward_working_set",
    "kv_cache_bytes",
    "logits_bytes",
    "reserved_engine_terms",
    "rollout_dtype",
    "sharded",
    "training_activations",
]
