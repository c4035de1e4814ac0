"""plugrl-megatron: the ``megatron`` training backend, on megatron-core.

Only the registration and the ``prepare_backend`` hook live here; megatron-core is imported
when a run chooses the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api import hookimpl

if TYPE_CHECKING:
    from plugrl.api import Recipe

# plugrl-megatron is not on a package index: it installs from its folder in plugrl's repository
INSTALL = "pip install './plugins/backends/megatron[megatron]' from the root of plugrl's repository"


@hookimpl
def register_training_backends(register):
    register(
        "megatron",
        "plugrl_megatron.backend:MegatronBackend",
        config="plugrl_megatron.config:MegatronActorConfig",
        # "megatron", not "megatron.core": looking a submodule up imports its parent package,
        # and the core refuses to prepare a backend whose framework was imported first
        requires=["megatron", "transformers", "safetensors"],
        install=INSTALL,
        framework_modules=["megatron"],
        description="megatron-core GPT models (Qwen2/Qwen3 dense) with tensor, pipeline, "
        "context and expert parallelism",
    )


@hookimpl
def prepare_backend(device: str, backend: str, recipe: Recipe) -> list[str] | None:
    """On the cpu device, the shims megatron-core needs without CUDA (see cpu_shims)."""
    if backend != "megatron" or device != "cpu":
        return None
    from plugrl_megatron import cpu_shims

    return cpu_shims.apply()


@hookimpl
def estimate_memory(recipe, role, shape, context):
    from plugrl_megatron.memory import estimate_memory as megatron_terms

    return megatron_terms(recipe, role, shape, context)
