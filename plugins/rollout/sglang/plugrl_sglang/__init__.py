"""plugrl-sglang: the ``sglang`` rollout engine (SGLang's offline ``Engine``).

This module only registers; SGLang is imported when a recipe chooses ``rollout.engine:
sglang``, in the process that hosts the engine.
"""

from __future__ import annotations

import plugrl

INSTALL = "pip install 'plugrl-sglang[sglang]'"


@plugrl.hookimpl
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
