"""Stand-ins for parts that live in other distributions (plugrl-npu, plugrl-megatron,
plugrl-vllm): registered names and config classes that declare
the verl names of some of their keys, nothing that runs. With them, a converted script's
recipe validates as it would where those plugins are installed."""

from __future__ import annotations

from typing import Any

import attrs

import plugrl
from plugrl.config import option
from plugrl.parts.backend import ActorConfig
from plugrl.parts.rollout import RolloutConfig


class Part:
    """Stands for a class that a recipe only names."""


@attrs.define(kw_only=True)
class MegatronActorConfig(ActorConfig):
    tensor_model_parallel_size: int = option(
        1,
        "Tensor parallel ranks.",
        verl="actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    )
    pipeline_model_parallel_size: int = option(
        1,
        "Pipeline stages.",
        verl="actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
    )


@attrs.define(kw_only=True)
class VLLMRolloutConfig(RolloutConfig):
    enforce_eager: bool = option(
        False, "No CUDA graphs.", verl="actor_rollout_ref.rollout.enforce_eager"
    )
    enable_chunked_prefill: bool = option(
        True, "Chunked prefill.", verl="actor_rollout_ref.rollout.enable_chunked_prefill"
    )
    max_num_batched_tokens: int = option(
        8192, "Tokens per step.", verl="actor_rollout_ref.rollout.max_num_batched_tokens"
    )
    engine_kwargs: dict[str, Any] = option(
        factory=dict,
        help="More engine arguments.",
        verl="actor_rollout_ref.rollout.engine_kwargs.vllm",
    )


@plugrl.hookimpl
def register_devices(register):
    register("npu", Part)


@plugrl.hookimpl
def register_training_backends(register):
    register("megatron", Part, config=MegatronActorConfig)


@plugrl.hookimpl
def register_rollout_engines(register):
    register("vllm", Part, config=VLLMRolloutConfig)
