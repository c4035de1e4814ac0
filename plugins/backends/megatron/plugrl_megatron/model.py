"""Building megatron-core's process groups and a GPTModel from a Hugging Face folder."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

from plugrl.api import RecipeError
from plugrl_megatron import convert
from plugrl_megatron.sharding import partition_dim, shard

logger = logging.getLogger("plugrl.megatron")

if TYPE_CHECKING:
    from plugrl.api import Recipe
    from plugrl_megatron.config import MegatronActorConfig


def initialize_parallel(config: MegatronActorConfig) -> None:
    """megatron-core's groups over the role's process group (already initialised). Groups are
    process-wide: with ``cluster: local`` the actor and the reference model share them, so
    existing groups of the same sizes are kept."""
    sizes = (
        config.tensor_model_parallel_size,
        config.pipeline_model_parallel_size,
        config.virtual_pipeline_model_parallel_size,
        config.context_parallel_size,
        config.expert_model_parallel_size,
        config.expert_tensor_parallel_size or config.tensor_model_parallel_size,
    )
    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_virtual_pipeline_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_expert_tensor_parallel_world_size(),
        )
        if current == sizes:
            return
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config.tensor_model_parallel_size,
        pipeline_model_parallel_size=config.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=config.virtual_pipeline_model_parallel_size,
        context_parallel_size=config.context_parallel_size,
        expert_model_parallel_size=config.expert_model_parallel_size,
        expert_tensor_parallel_size=config.expert_tensor_parallel_size,
    )


def hf_config(recipe: Recipe) -> Any:
    """The model's Hugging Face config with ``model.override_config`` applied."""
    from transformers import AutoConfig

    path = recipe.model.path
    if not path or not (Path(path) / "config.json").is_file():
        raise RecipeError(
            f"{path!r} is not a Hugging Face model folder (no config.json); give a local folder "
            "saved with save_pretrained",
            key="model.path",
        )
    config = AutoConfig.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code)
    for name, value in recipe.model.override_config.items():
        if not hasattr(config, name):
            raise RecipeError(
                f"{type(config).__name__} has no field {name!r}; see the model's config.json",
                key=f"model.override_config.{name}",
            )
        setattr(config, name, value)
    convert.check_supported(config)
    return config


def _recompute_settings(config: MegatronActorConfig, recipe: Recipe) -> dict[str, Any]:
    granularity = config.recompute_granularity
    if granularity is None and recipe.model.enable_gradient_checkpointing:
        granularity = "full"
    if granularity is None:
        return {}
    if granularity == "selective":
        settings: dict[str, Any] = {"recompute_granularity": "selective"}
        if config.recompute_modules is not None:
            settings["recompute_modules"] = list(config.recompute_modules)
        return settings
    return {
        "recompute_granularity": "full",
        "recompute_method": config.recompute_method,
        "recompute_num_layers": config.recompute_num_layers,
    }


def transformer_config(
    hf: Any,
    config: MegatronActorConfig,
    recipe: Recipe,
    *,
    params_dtype: torch.dtype,
    on_cpu: bool,
) -> TransformerConfig:
    """The TransformerConfig of the Hugging Face model under the recipe's parallel sizes."""
    tp = config.tensor_model_parallel_size
    if config.sequence_parallel and tp > 1:
        logger.info(
            "megatron: sequence_parallel is off: the local layer spec's norms do not support it"
        )
    settings: dict[str, Any] = {
        **convert.transformer_settings(hf),
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": config.virtual_pipeline_model_parallel_size,
        "context_parallel_size": config.context_parallel_size,
        "expert_model_parallel_size": config.expert_model_parallel_size,
        "expert_tensor_parallel_size": config.expert_tensor_parallel_size,
        # the local layer spec's torch norms cannot split along the sequence (Transformer
        # Engine's can; that spec is not used here yet)
        "sequence_parallel": False,
        "params_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        # micro-batches differ in length; pipeline stages then exchange shapes first (megatron
        # allows that only with the all-to-all token dispatcher, unused by dense models)
        "variable_seq_lengths": config.pipeline_model_parallel_size > 1,
        "moe_token_dispatcher_type": "alltoall",
        # weights come from the Hugging Face folder right after the build
        "perform_initialization": False,
        "use_cpu_initialization": on_cpu,
        **_recompute_settings(config, recipe),
    }
    for name, value in config.override_transformer_config.items():
        if not any(field.name == name for field in _dataclass_fields(TransformerConfig)):
            raise RecipeError(
                f"TransformerConfig has no field {name!r} (megatron-core spells its fields "
                "as in megatron/core/transformer/transformer_config.py)",
                key=f"actor.override_transformer_config.{name}",
            )
        settings[name] = value
    return TransformerConfig(**settings)


def _dataclass_fields(cls: type) -> tuple[Any, ...]:
    import dataclasses

    return dataclasses.fields(cls)


def build_chunks(config: TransformerConfig, hf: Any) -> list[GPTModel]:
    """This rank's model chunks: one per virtual pipeline stage (one without interleaving)."""
    spec = get_gpt_layer_local_spec(
        qk_layernorm=config.qk_layernorm, normalization=config.normalization
    )
    settings = convert.model_settings(hf)
    virtual = config.virtual_pipeline_model_parallel_size or 1
    chunks = []
    for stage in range(virtual):
        vp_stage = stage if virtual > 1 else None
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=spec,
                pre_process=parallel_state.is_pipeline_first_stage(
                    ignore_virtual=False, vp_stage=vp_stage
                ),
                post_process=parallel_state.is_pipeline_last_stage(
                    ignore_virtual=False, vp_stage=vp_stage
                ),
                # whole-vocabulary logits: log-probs and entropies then need no
                # vocabulary-parallel arithmetic (at the price of gathering the logits)
                parallel_output=False,
                vp_stage=vp_stage,
                **settings,
            )
        )
    return chunks


def global_name(chunk: GPTModel, local_name: str) -> str:
    """``decoder.layers.<i>...`` with the chunk's local layer index replaced by the layer's
    place in the whole model, which is what the Hugging Face mapping needs."""
    if not local_name.startswith("decoder.layers."):
        return local_name
    index, _, rest = local_name.removeprefix("decoder.layers.").partition(".")
    layer = chunk.decoder.layers[int(index)]
    return f"decoder.layers.{layer.layer_number - 1}.{rest}"


def named_parameters(chunks: list[GPTModel]) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """This rank's parameters under whole-model names. With tied embeddings a last pipeline
    stage that is not also the first holds ``output_layer.weight``, a copy of the embedding
    kept equal to it by megatron; where both live on one stage it is the embedding itself."""
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            yield global_name(chunk, name), param


@attrs.define
class _WeightFiles:
    """Tensors of a Hugging Face folder's safetensors files, read one at a time."""

    folder: Path
    where: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    def open(cls, folder: str) -> _WeightFiles:
        path = Path(folder)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return cls(path, dict(weight_map))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise RecipeError(
                f"{folder!r} has no *.safetensors files; save the model with "
                "save_pretrained(safe_serialization=True)",
                key="model.path",
            )
        from safetensors import safe_open

        where = {}
        for file in files:
            with safe_open(file, framework="pt") as handle:
                where.update(dict.fromkeys(handle.keys(), file.name))
        return cls(path, where)

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        out = {}
        for file in sorted({self.where[name] for name in names}):
            with safe_open(self.folder / file, framework="pt") as handle:
                for name in names:
                    if self.where[name] == file:
                        out[name] = handle.get_tensor(name)
        return out

    def __contains__(self, name: str) -> bool:
        return name in self.where


@torch.no_grad()
def load_hf_weights(chunks: list[GPTModel], hf: Any, folder: str) -> None:
    """Fill this rank's parameters from the Hugging Face folder: each weight is read, fused
    into megatron's layout and cut to this rank's tensor-parallel piece, one at a time."""
    files = _WeightFiles.open(folder)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    for name, param in named_parameters(chunks):
        sources = convert.hf_sources(hf, name)
        missing = [source for source in sources if source not in files]
        if missing:
            raise RecipeError(
                f"{folder!r} has no weight {missing[0]!r}, which megatron's {name} is made of; "
                "give the folder of a complete Hugging Face checkpoint",
                key="model.path",
            )
        tensors = files.read(sources)
        whole = convert.from_hf_weight(hf, name, [tensors[source] for source in sources])
        dim = partition_dim(name)
        piece = whole if dim is None else shard(name, whole, dim, tp_rank, tp_size)
        if tuple(piece.shape) != tuple(param.shape):
            raise RecipeError(
                f"{name}: the checkpoint gives shape {tuple(piece.shape)} on this rank, the model "
                f"expects {tuple(param.shape)}; does config.json match the weights?",
                key="model.path",
            )
        param.copy_(piece.to(param.dtype))
    mark_split_weights(chunks)


def mark_split_weights(chunks: list[GPTModel]) -> None:
    """Mark the weights cut over tensor-parallel ranks as megatron does when it initialises
    them itself (weights loaded into a model built without initialisation are unmarked, and
    megatron's gradient norm counts unmarked weights on the first tensor-parallel rank only)."""
    for name, param in named_parameters(chunks):
        dim = partition_dim(name)
        if dim is not None:
            param.tensor_model_parallel = True
            param.partition_dim = dim
            param.partition_stride = 1


DIST_CHECKPOINT_KEY = "actor.dist_checkpointing_path"


@torch.no_grad()
def load_dist_checkpoint(chunks: list[GPTModel], folder: str) -> None:
    """Fill this rank's parameters from a megatron-core ``dist_checkpointing`` folder: each
    chunk's sharded state dict names the pieces this rank holds, whatever layout wrote the
    folder (collective over the role's ranks)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from torch.distributed.checkpoint.api import CheckpointException

    fix = (
        "give a folder written by megatron.core.dist_checkpointing.save from the model's "
        "sharded_state_dict(), or set actor.use_dist_checkpointing false to load model.path"
    )
    if not Path(folder).is_dir() or not dist_checkpointing.check_is_distributed_checkpoint(folder):
        raise RecipeError(
            f"{folder!r} is not a megatron-core dist_checkpointing folder (no readable "
            f"metadata.json); {fix}",
            key=DIST_CHECKPOINT_KEY,
        )
    for chunk in chunks:
        try:
            # unexpected keys (an optimizer's state saved beside the model) are not this
            # model's; missing ones raise
            state = dist_checkpointing.load(
                chunk.sharded_state_dict(), folder, strict=StrictHandling.ASSUME_OK_UNEXPECTED
            )
            chunk.load_state_dict(state, strict=False)
        except (Exception, CheckpointException) as exc:
            raise RecipeError(
                f"{folder!r} could not be loaded into the model ({_cause(exc)}); {fix}",
                key=DIST_CHECKPOINT_KEY,
            ) from exc
    mark_split_weights(chunks)


def _cause(exc: BaseException) -> str:
    """``Type: first line`` of what went wrong; torch's checkpoint reader reports the failure
    of each rank wrapped in a ``CheckpointException`` (a BaseException), so the first of those
    is named instead."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = getattr(first, "exception", first)
    lines = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {lines[0][:300]}" if lines else "")
