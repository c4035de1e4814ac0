"""plugrl-sglang: the ``sglang`` rollout engine (SGLang's offline ``Engine``).

This module only registers; SGLang is imported when a recipe chooses ``rollout.engine:
sglang``, in the process that hosts the engine.
"""

from __future__ import annotations

from plugrl.api import hookimpl

# plugrl-sglang is not on a package index: it installs from its folder in plugrl's repository
INSTALL = "pip install './plugins/rollout/sglang[sglang]' from the root of plugrl's repository"


@hookimpl
def register_rollout_engines(register):
    register(
        "sglang",
        "plugrl_sglang.engine:SGLangRolloutEngine",
        config="plugrl_sglang.config:SGLangRolloutConfig",
        requires=["sglang"],
        install=INSTALL,
        framework_modules=["sglang"],
        description="SGLang's Engine: continuous batching, weight updates from tensors, "
        "memory release, pause and abort",
    )


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_sglang.memory import estimate_memory as sglang_terms

    return sglang_terms(recipe, role, shape, context)
