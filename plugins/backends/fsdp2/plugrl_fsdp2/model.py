"""Loading Hugging Face models for a role and sharding them with ``fully_shard``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from plugrl.api import RecipeError
from plugrl.api.data import quiet_hf_loading

if TYPE_CHECKING:
    from plugrl.api import Recipe
    from plugrl.api.backend import Role
    from plugrl.api.devices import Device
    from plugrl_fsdp2.config import FSDP2ActorConfig

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def model_path(recipe: Recipe, role: Role) -> tuple[str, str]:
    """The folder a role's weights come from, and the recipe key that set it."""
    if role == "critic" and recipe.critic.model_path:
        return recipe.critic.model_path, "critic.model_path"
    if not recipe.model.path:
        raise RecipeError("is not set; give the folder of a Hugging Face model", key="model.path")
    return recipe.model.path, "model.path"


def weight_dtypes(recipe: Recipe, role: Role) -> tuple[torch.dtype, torch.dtype]:
    """``(dtype the weights are held in, dtype forward runs in)`` for a role.

    Trainable roles under mixed precision hold float32 weights (the optimizer updates those)
    and compute in ``model.dtype``; the frozen reference model has no use for float32 copies.
    """
    compute = DTYPES[recipe.model.dtype]
    config: FSDP2ActorConfig = recipe.actor  # type: ignore[assignment]
    mixed = getattr(config, "mixed_precision", True)
    if role != "ref" and mixed and compute != torch.float32:
        return torch.float32, compute
    return compute, compute


def _model_config(recipe: Recipe, role: Role) -> tuple[Any, Any, str]:
    """``(config, model class, folder)`` for a role, with ``model.override_config`` applied."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    path, key = model_path(recipe, role)
    if not (Path(path) / "config.json").is_file():
        raise RecipeError(
            f"{path!r} is not a Hugging Face model folder (no config.json); give a local folder "
            "saved with save_pretrained",
            key=key,
        )
    config = AutoConfig.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code)
    for name, value in recipe.model.override_config.items():
        if not hasattr(config, name):
            raise RecipeError(
                f"{type(config).__name__} has no field {name!r}; see the model's config.json",
                key=f"model.override_config.{name}",
            )
        setattr(config, name, value)
    if role == "critic":
        config.num_labels = 1
        # a random dropout mask on the value head would make value estimates noisy
        config.classifier_dropout = 0.0
        if getattr(config, "vision_config", None) is not None:
            raise RecipeError(
                "a value model of a vision-language model is not supported yet; use an "
                "estimator without a critic (grpo, rloo, ...)",
                key="critic.enable",
            )
        return config, AutoModelForTokenClassification, path
    if getattr(config, "vision_config", None) is not None:
        # a vision-language model: its language-model head over text and image tokens
        return config, AutoModelForImageTextToText, path
    return config, AutoModelForCausalLM, path


def load_model(recipe: Recipe, role: Role, dtype: torch.dtype) -> torch.nn.Module:
    """A Hugging Face model for ``role``: a causal LM for actor and ref; for the critic, the
    same network with a one-output token-classification head (the value head) instead of the
    LM head, initialised from the seeded RNG."""
    config, model_class, path = _model_config(recipe, role)
    with quiet_hf_loading():
        return model_class.from_pretrained(
            path, config=config, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code
        )


def empty_model(recipe: Recipe, role: Role, dtype: torch.dtype) -> torch.nn.Module:
    """The model :func:`load_model` gives, with its tensors on the meta device: the structure
    alone, no memory and no file read beyond ``config.json``."""
    config, model_class, _ = _model_config(recipe, role)
    with torch.device("meta"):
        return model_class.from_config(
            config, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code
        )


@torch.no_grad()
def fill_from_rank0(
    model: torch.nn.Module,
    source: torch.nn.Module | None,
    device: torch.device,
    *,
    offload: bool = False,
) -> None:
    """Give a sharded model built on the meta device the weights of ``source``, which only
    rank 0 holds: each rank allocates its shards on ``device`` and receives them from rank 0,
    so no other rank ever holds the full weights.

    Buffers left out of state dicts (rotary frequencies) are broadcast from rank 0 too. With
    ``offload`` (FSDP2's CPU offload policy) the shards then move to the CPU, where that policy
    keeps them; buffers stay on ``device``.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if dist.get_rank() != 0:
        source = None  # whatever another rank holds, rank 0's weights are the ones sent
    elif source is None:
        raise ValueError("rank 0 must pass the loaded model")
    model.to_empty(device=device)
    set_model_state_dict(
        model,
        source.state_dict() if source is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    source_buffers = dict(source.named_buffers()) if source is not None else {}
    for name, buffer in model.named_buffers():
        if source is not None:
            buffer.copy_(source_buffers[name])
        dist.broadcast(buffer, src=0)
    if offload:
        model.to("cpu")
        for buffer in model.buffers():
            buffer.data = buffer.data.to(device)


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in backward (non-reentrant, which FSDP2 needs)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def device_mesh(device: Device, world_size: int, fsdp_size: int) -> DeviceMesh:
    """1-D mesh over all ranks, or 2-D ``(replicate, shard)`` for hybrid sharding, on the
    device's torch type (not its registered name, which torch need not know)."""
    if fsdp_size in (-1, world_size):
        return init_device_mesh(device.torch_device_type, (world_size,), mesh_dim_names=("fsdp",))
    if fsdp_size > world_size or world_size % fsdp_size:
        raise RecipeError(
            f"must divide the {world_size} ranks of the role (or be -1), got {fsdp_size}",
            key="actor.fsdp_size",
        )
    return init_device_mesh(
        device.torch_device_type,
        (world_size // fsdp_size, fsdp_size),
        mesh_dim_names=("replicate", "fsdp"),
    )


def shard_model(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    *,
    config: FSDP2ActorConfig,
    device: Device,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
) -> torch.nn.Module:
    """``fully_shard`` every decoder layer (the model's ``_no_split_modules``), then the root
    (embeddings, final norm, head), so one layer's full weights exist at a time."""
    options: dict = {"mesh": mesh, "reshard_after_forward": config.reshard_after_forward}
    if compute_dtype != param_dtype:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=compute_dtype, reduce_dtype=DTYPES[config.reduce_dtype]
        )
    if config.param_offload and device.torch_device_type != "cpu":
        options["offload_policy"] = CPUOffloadPolicy()
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise RecipeError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules); "
            "the fsdp2 backend shards per layer and needs one",
            key="model.path",
        )
    for layer in layers:
        fully_shard(layer, **options)
    # before the root's FSDP hook, which warns of every view among the outputs it is handed
    model.register_forward_hook(drop_vision_outputs, prepend=True)
    fully_shard(model, **options)
    return model


VISION_OUTPUTS = ("image_outputs", "video_outputs")
"""What a vision-language model's forward returns beside its logits: the vision tower's
outputs, whose per-picture embeddings are views of one tensor (a split)."""


def drop_vision_outputs(_module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
    """The model's output without the vision tower's outputs, which the backend never reads:
    FSDP2 would hook the per-picture embeddings' views and warn, at every training forward,
    that an in-place op on them would skip its gathers (the logits alone are read, out of
    place). The embeddings already reached the logits through the language model."""
    for name in VISION_OUTPUTS:
        if isinstance(output, dict) and output.get(name) is not None:
            output[name] = None
    return output
