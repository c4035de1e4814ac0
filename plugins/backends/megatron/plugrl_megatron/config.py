"""The ``actor`` section when ``actor.backend`` is ``megatron``: the common keys plus
megatron-core's parallel sizes, optimizer, recompute and transformer-config settings."""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.config import fraction, option, positive
from plugrl.parts.backend import ActorConfig
from plugrl_megatron.layout import data_parallel_size

_MEGATRON = "actor_rollout_ref.actor.megatron"
_TRANSFORMER = f"{_MEGATRON}.override_transformer_config"
_OPTIMIZER = "actor_rollout_ref.actor.optim.override_optimizer_config"


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
