"""Recipe keys of the ``hf`` rollout engine (beside the common ``rollout`` keys)."""

from __future__ import annotations

import attrs

from plugrl.api import option, positive
from plugrl.api.rollout import RolloutConfig


@attrs.define(kw_only=True)
class HFRolloutConfig(RolloutConfig):
    """``rollout`` with ``engine: hf``: sampling with the model's own forward and a KV cache."""

    attn_implementation: str = option(
        "sdpa",
        "Attention kernel of the engine's own model (its own weights, or its copy of the "
        "trainer's); an engine that generates with the trainer's module uses it as it is.",
        choices=["sdpa", "eager"],
    )
    max_prefill_tokens: int = option(
        8192,
        "Prompt tokens (rows x longest prompt) computed in one forward pass when requests join "
        "the running batch; more rows run in several passes (a single longer prompt still "
        "runs in one).",
        validator=positive,
    )
    lean_decode: bool = option(
        True,
        "Compute decode steps and prompt passes of Llama, Qwen2 and Qwen3 models directly on "
        "their weights (fused projections, no module dispatch): the same logits, faster. "
        "Other models, and models with forward hooks (adapters, instrumentation), run their "
        "own forward; a trainer's FSDP module is copied first (copy_trainer_weights). The "
        "fused copies hold the attention-input and gate/up weights a second time.",
    )
    copy_trainer_weights: bool = option(
        True,
        "A colocated engine in the trainer's process generates from its own plain copy of "
        "the trainer's weights, in rollout.dtype, refreshed at each weight sync, when the "
        "trainer's module is managed by its backend (FSDP: hooks and DTensor weights keep it "
        "off the lean path) or in another dtype. The copy costs one model in rollout.dtype "
        "(plus lean_decode's fused weights); false generates with the trainer's module "
        "itself, through its own forward and in the trainer's dtype.",
    )
