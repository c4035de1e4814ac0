"""Reward manager ``reward_model``: responses scored by a discriminative reward model.

Registered by path, so torch and transformers are imported only when a run chooses it.
"""

from __future__ import annotations

from plugrl.api import hookimpl

_MANAGER = "plugrl_reward_model.manager"


@hookimpl
def register_reward_managers(register):
    register(
        "reward_model",
        f"{_MANAGER}:RewardModelManager",
        config=f"{_MANAGER}:RewardModelConfig",
        description="A sequence-classification reward model scores prompt and response",
    )


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_reward_model.memory import estimate_memory as reward_model_terms

    return reward_model_terms(recipe, role, shape, context)
