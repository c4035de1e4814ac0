"""The ``actor`` section when ``actor.backend`` is ``fsdp2``: the common keys plus sharding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.api import ConfigValueError, PackageNeed, RecipeError, option, positive
from plugrl.api.backend import ActorConfig

if TYPE_CHECKING:
    from plugrl.recipe import Recipe

LORA_INSTALL = "pip install peft (or set model.lora_rank=0)"
"""How to get what LoRA adapters need; peft comes with plugrl, so only a trimmed install lacks
it."""


def _all_or_positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value != -1 and value <= 0:
        raise ConfigValueError(attribute.name, f"must be -1 (all ranks) or > 0, got {value!r}")


@attrs.define(kw_only=True)
class FSDP2ActorConfig(ActorConfig):
    """FSDP2 settings. They apply to every model the backend builds (actor, ref, critic).

    With ``ulysses_sequence_parallel_size`` > 1 the rank count of a role must be a multiple of
    it; each group of that many ranks is one data-parallel rank.
    """

    supports_lora: ClassVar[bool] = True
    sends_lora_adapters: ClassVar[bool] = True

    fsdp_size: int = option(
        -1,
        "Ranks one copy of the weights is sharded over; -1 shards over all ranks of the role. "
        "A smaller divisor of the rank count replicates the shards (hybrid sharding, HSDP).",
        verl="actor_rollout_ref.actor.fsdp_config.fsdp_size",
        validator=_all_or_positive,
    )
    param_offload: bool = option(
        False,
        "Keep parameters, gradients and optimizer state in CPU memory and move each layer to "
        "the device only while it runs (the optimizer step runs on the CPU). No effect on cpu.",
        verl="actor_rollout_ref.actor.fsdp_config.param_offload",
    )
    reshard_after_forward: bool = option(
        True,
        "Free the gathered layer weights after forward and gather them again for backward "
        "(less memory, more communication).",
        verl="actor_rollout_ref.actor.fsdp_config.reshard_after_forward",
    )
    mixed_precision: bool = option(
        True,
        "When model.dtype is bfloat16 or float16, keep trainable weights and optimizer state in "
        "float32 and compute in model.dtype; false trains the weights in model.dtype itself. "
        "The frozen reference model is always held in model.dtype.",
        verl="actor_rollout_ref.actor.fsdp_config.mixed_precision",
    )
    reduce_dtype: str = option(
        "float32",
        "dtype gradients are averaged across ranks in.",
        choices=["float32", "bfloat16", "float16"],
        verl="actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype",
    )
    use_remove_padding: bool = option(
        False,
        "Run forwards packed: the attended tokens of a micro-batch's rows end to end in one "
        "row, each with its own positions, attention kept within each row (flash-attention's "
        "variable-length kernel where installed on CUDA, else causal SDPA per row). No padding "
        "token is computed and use_dynamic_bsz counts real tokens. Off by default: on CPU it "
        "measured no faster than padded rows, which are already cut to their own lengths. "
        "Models with sliding-window attention always run padded; vision-language models pack "
        "with their own multi-section (M-RoPE) positions.",
        verl="actor_rollout_ref.model.use_remove_padding",
    )
    freeze_vision_tower: bool = option(
        False,
        "Train only the language model of a vision-language model: its vision tower gets no "
        "gradient and no optimizer state (the actor; the reference model trains nothing).",
        verl="actor_rollout_ref.actor.freeze_vision_tower",
    )
    ulysses_sequence_parallel_size: int = option(
        1,
        "Ranks each sequence is split over (Ulysses sequence parallelism): consecutive groups "
        "of this many ranks get the same micro-batches, each rank runs the model on its part "
        "of every sequence, and attention exchanges heads for sequence by all-to-all. It must "
        "divide the ranks of the role and the model's attention and key-value heads. The "
        "reference model and the critic use the same groups. ppo_max_token_len_per_gpu stays "
        "per rank: a micro-batch holds up to it times this many tokens.",
        verl="actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        validator=positive,
    )

    def packages_needed(self, recipe: Recipe) -> list[PackageNeed]:
        if recipe.model.lora_rank > 0:
            return [PackageNeed("model.lora_rank", "peft", LORA_INSTALL)]
        return []

    def data_parallel_size(self, ranks: int) -> int:
        """``ranks`` over ``ulysses_sequence_parallel_size``: a sequence-parallel group splits
        each sequence of one data-parallel share."""
        sp = self.ulysses_sequence_parallel_size
        if ranks % sp:
            raise RecipeError(
                f"{sp} does not divide the {ranks} ranks of each model (trainer.nnodes x "
                "trainer.n_gpus_per_node, 1 with cluster.mode=local); use a divisor of "
                f"{ranks}",
                key="actor.ulysses_sequence_parallel_size",
            )
        return ranks // sp

    def sequence_parallel_size(self) -> int:
        return self.ulysses_sequence_parallel_size
