"""The ``vllm`` rollout engine: vLLM behind plugrl's engine interface.

Importing this package is cheap and never imports vLLM: the engine's module is imported only
when a run chooses ``rollout.engine: vllm``. Without vLLM installed the engine is listed as
unavailable, with the command that installs it, and a run that chooses it stops at start-up.
"""

from __future__ import annotations

from plugrl.api import hookimpl

# plugrl-vllm is not on a package index: it installs from its folder in plugrl's repository
INSTALL = (
    "pip install './plugins/rollout/vllm[vllm]', or './plugins/rollout/vllm[cpu]' on a CPU, "
    "from the root of plugrl's repository"
)


@hookimpl
def register_rollout_engines(register):
    register(
        "vllm",
        "plugrl_vllm.engine:VLLMRolloutEngine",
        config="plugrl_vllm.config:VLLMRolloutConfig",
        requires=["vllm"],
        install=INSTALL,
        description="vLLM: continuous batching, abort, pause and weight updates in buckets",
        # a plugin that patches vLLM (vllm-ascend on npu) must do so before it is imported
        framework_modules=["vllm"],
    )


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_vllm.memory import estimate_memory as vllm_terms

    return vllm_terms(recipe, role, shape, context)
