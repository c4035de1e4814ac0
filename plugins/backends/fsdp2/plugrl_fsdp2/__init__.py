"""The ``fsdp2`` training backend: Hugging Face causal LMs sharded with torch's ``fully_shard``.

Only the registration lives here; torch and transformers are imported when a run chooses it.
"""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_training_backends(register):
    register(
        "fsdp2",
        "plugrl_fsdp2.backend:FSDP2Backend",
        config="plugrl_fsdp2.config:FSDP2ActorConfig",
        requires=["torch", "transformers"],
        description="Hugging Face causal LMs sharded with PyTorch FSDP2 (fully_shard)",
    )


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_fsdp2.memory import estimate_memory as fsdp2_terms

    return fsdp2_terms(recipe, role, shape, context)
