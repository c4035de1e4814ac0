"""The ``hf`` rollout engine: batched sampling with a Hugging Face model's forward and a KV
cache, colocated with the trainer's model or holding its own copy."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_rollout_engines(register):
    register(
        "hf",
        "plugrl_hf.engine:HFRolloutEngine",
        config="plugrl_hf.config:HFRolloutConfig",
        requires=["torch", "transformers"],
        description="Hugging Face model forward with a KV cache; runs anywhere torch does",
    )


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_hf.memory import estimate_memory as hf_terms

    return hf_terms(recipe, role, shape, context)
