"""The ``actor`` section when ``actor.backend`` is ``megatron``: the common keys plus
megatron-core's parallel sizes, optimizer, recompute and transformer-config settings."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, fraction, option, positive
from plugrl.api.backend import ActorConfig
from plugrl_megatron.layout import data_parallel_size

_MEGATRON = "actor_rollout_ref.actor.megatron"
_TRANSFORMER = f"{_MEGATRON}.override_transformer_config"
_OPTIMIZER = "actor_rollout_ref.actor.optim.override_optimizer_config"
_REF = "actor_rollout_ref.ref.megatron"


def _no_megatron_bridge(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is False:
        raise ConfigValueError(
            attribute.name,
            "false asks for NVIDIA's Megatron-Bridge (its model providers and LoRA), which "
            "plugrl-megatron does not have; set it true (plugrl converts Qwen2/Qwen3 dense "
            "weights itself)",
        )


@attrs.define(kw_only=True)
class MegatronActorConfig(ActorConfig):
    """megatron-core settings. They apply to every model the backend builds (actor, ref).

    The rank count of a role must be a multiple of tensor x pipeline x context parallel
    sizes; the rest is data parallelism.
    """

    tensor_model_parallel_size: int = option(
        1,
        "Ranks each layer's matrices are split over (tensor parallelism).",
        verl=f"{_MEGATRON}.tensor_model_parallel_size",
        validator=positive,
    )
    pipeline_model_parallel_size: int = option(
        1,
        "Ranks the layers are split over, in consecutive stages (pipeline parallelism).",
        verl=f"{_MEGATRON}.pipeline_model_parallel_size",
        validator=positive,
    )
    virtual_pipeline_model_parallel_size: int | None = option(
        None,
        "Model chunks per pipeline stage (interleaved schedule); unset: one.",
        verl=f"{_MEGATRON}.virtual_pipeline_model_parallel_size",
        validator=positive,
    )
    context_parallel_size: int = option(
        1,
        "Ranks each sequence is split over (context parallelism).",
        verl=f"{_MEGATRON}.context_parallel_size",
        validator=positive,
    )
    expert_model_parallel_size: int = option(
        1,
        "Ranks the experts of a mixture-of-experts layer are spread over.",
        verl=f"{_MEGATRON}.expert_model_parallel_size",
        validator=positive,
    )
    expert_tensor_parallel_size: int | None = option(
        None,
        "Tensor parallelism inside each expert; unset: tensor_model_parallel_size.",
        verl=f"{_MEGATRON}.expert_tensor_parallel_size",
        validator=positive,
    )
    sequence_parallel: bool = option(
        True,
        "Split layer norms and dropout along the sequence over the tensor-parallel ranks "
        "(only when tensor_model_parallel_size > 1). Needs Transformer Engine's layer spec, "
        "which this backend does not build yet: ignored, with a log line.",
        verl=f"{_MEGATRON}.sequence_parallel",
    )
    use_distributed_optimizer: bool = option(
        True,
        "Shard optimizer state over the data-parallel ranks (ZeRO-1).",
        verl=f"{_MEGATRON}.use_distributed_optimizer",
    )
    optimizer_cpu_offload: bool = option(
        False,
        "Keep optimizer state in CPU memory and step there (needs use_distributed_optimizer).",
        verl=f"{_OPTIMIZER}.optimizer_cpu_offload",
    )
    optimizer_offload_fraction: float = option(
        1.0,
        "Fraction of the optimizer state offloaded when optimizer_cpu_offload is on.",
        verl=f"{_OPTIMIZER}.optimizer_offload_fraction",
        validator=fraction,
    )
    overlap_cpu_optimizer_d2h_h2d: bool = option(
        False,
        "Overlap the copies to and from the offloaded optimizer with compute.",
        verl=f"{_OPTIMIZER}.overlap_cpu_optimizer_d2h_h2d",
    )
    param_offload: bool = option(
        False,
        "Keep the actor's parameters in host memory outside the phases that use them (log-probs, "
        "updates, weight pushes, checkpoints): they move to the device before each and back "
        "after it. The reference model has its own switch, ref_param_offload.",
        verl=f"{_MEGATRON}.param_offload",
    )
    grad_offload: bool = option(
        False,
        "Free the actor's gradient buffers outside updates (they are zeroed before each "
        "update, so nothing is copied).",
        verl=f"{_MEGATRON}.grad_offload",
    )
    optimizer_offload: bool = option(
        False,
        "Keep the optimizer's state (moments, and the float32 main weights under mixed "
        "precision) in host memory outside updates and checkpoints. Unlike "
        "optimizer_cpu_offload the step still runs on the device.",
        verl=f"{_MEGATRON}.optimizer_offload",
    )
    ref_param_offload: bool = option(
        False,
        "Keep the reference model's parameters in host memory outside its log-prob passes.",
        verl=f"{_REF}.param_offload",
    )
    use_dist_checkpointing: bool = option(
        False,
        "Load the initial weights (actor and reference model) from a megatron-core "
        "dist_checkpointing folder, dist_checkpointing_path, instead of the safetensors of "
        "model.path (whose config.json still describes the model).",
        verl=f"{_MEGATRON}.use_dist_checkpointing",
    )
    dist_checkpointing_path: str | None = option(
        None,
        "The megatron-core dist_checkpointing folder read when use_dist_checkpointing is on: "
        "one saved from a GPTModel's sharded_state_dict(), in any parallel layout.",
        verl=f"{_MEGATRON}.dist_checkpointing_path",
        path="input",
    )
    use_mbridge: bool = option(
        True,
        "true: Hugging Face weights are converted to megatron-core's layout and back by "
        "plugrl-megatron itself (what mbridge does in verl). false (verl's older per-model "
        "converters) gives the same weights: the same conversion runs.",
        verl=f"{_MEGATRON}.use_mbridge",
    )
    vanilla_mbridge: bool = option(
        True,
        "true: the mbridge conversion, which plugrl-megatron's own stands for. false (NVIDIA's "
        "Megatron-Bridge) is refused: plugrl-megatron has neither its model providers nor "
        "its LoRA.",
        verl=f"{_MEGATRON}.vanilla_mbridge",
        validator=_no_megatron_bridge,
    )
    recompute_granularity: str | None = option(
        None,
        "Activation recompute: full (whole layers) or selective (attention core only); "
        "unset: none, or full when model.enable_gradient_checkpointing is on.",
        choices=[None, "full", "selective"],
        verl=f"{_TRANSFORMER}.recompute_granularity",
    )
    recompute_method: str = option(
        "uniform",
        "With full recompute: uniform (every recompute_num_layers layers) or block (the first "
        "recompute_num_layers layers of each stage).",
        choices=["uniform", "block"],
        verl=f"{_TRANSFORMER}.recompute_method",
    )
    recompute_num_layers: int = option(
        1,
        "Layers per recompute group (uniform) or recomputed layers per stage (block).",
        verl=f"{_TRANSFORMER}.recompute_num_layers",
        validator=positive,
    )
    recompute_modules: list[str] | None = option(
        None,
        'With selective recompute: which parts (megatron-core\'s names, e.g. ["core_attn"]).',
        verl=f"{_TRANSFORMER}.recompute_modules",
    )
    override_transformer_config: dict[str, Any] = option(
        factory=dict,
        help="TransformerConfig fields set as given, after everything above (names and values "
        "as megatron-core spells them).",
        verl=_TRANSFORMER,
    )

    def data_parallel_size(self, ranks: int) -> int:
        """``ranks`` over tensor x pipeline x context parallel sizes, as megatron-core counts
        data-parallel ranks (expert parallelism splits experts inside that grid, not the
        batch)."""
        return data_parallel_size(
            ranks,
            self.tensor_model_parallel_size,
            self.pipeline_model_parallel_size,
            self.context_parallel_size,
        )
