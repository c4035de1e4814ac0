"""What a plugin's ``estimate_memory`` gets besides the recipe: the run's layout in devices and
the token counts of its micro-batches, computed once by the kernel so that every plugin counts
them alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from plugrl.plan.shape import ModelShape
    from plugrl.recipe import Recipe


@attrs.frozen
class MicroBatch:
    """The largest micro-batch of a pass on one rank: its tokens (prompt and response, what
    the layers see) and its response tokens (what the logits are computed for)."""

    tokens: int
    response_tokens: int


@attrs.frozen
class PlanContext:
    """The run's layout, as the recipe gives it, for the ``estimate_memory`` hook."""

    trainer_ranks: int
    """Ranks (devices) of each training role: ``trainer.nnodes x trainer.n_gpus_per_node``,
    1 with ``cluster.mode=local``."""
    rollout_devices: int
    """Devices of the engines: the trainer's when colocated, else ``rollout.nnodes x
    rollout.n_gpus_per_node``."""
    colocated: bool
    """Engines share the trainer's devices (and sleep while it trains)."""
    device_memory: int | None
    """Bytes of memory of one device, when known."""
    update: MicroBatch
    """The update's micro-batch on one rank."""
    log_prob: MicroBatch
    """The log-prob pass's micro-batch on one rank."""
    rollout_rows: int
    """Sequences generated per step (``train_batch_size x rollout.n``, or the generation
    batch)."""
    sequence_length: int
    """``max_prompt_length + max_response_length``."""
    shape_of: Callable[[str], ModelShape]
    """The shape of another model (a critic's or a reward model's path)."""


def trainer_ranks(recipe: Recipe) -> int:
    """Ranks of each training role for ``recipe``."""
    if recipe.cluster.mode != "ray":
        return 1
    return recipe.trainer.nnodes * recipe.trainer.n_gpus_per_node


def micro_batches(recipe: Recipe, ranks: int) -> tuple[MicroBatch, MicroBatch]:
    """The update's and the log-prob pass's largest micro-batch on one rank.

    With ``actor.use_dynamic_bsz`` a micro-batch holds up to ``ppo_max_token_len_per_gpu``
    tokens per rank; the share of them that are response tokens is taken as in a full-length
    row, ``max_response_length / (max_prompt_length + max_response_length)``. Without it a
    micro-batch is ``ppo_micro_batch_size_per_gpu`` rows (unset: the rank's whole share of a
    mini-batch) padded to the full length, split over the sequence-parallel ranks.
    """
    actor = recipe.actor
    prompt, response = recipe.data.max_prompt_length, recipe.data.max_response_length
    length = prompt + response
    sp = actor.sequence_parallel_size()
    if actor.use_dynamic_bsz:
        tokens = actor.ppo_max_token_len_per_gpu
        batch = MicroBatch(tokens, tokens * response // length)
        return batch, batch
    data_parallel = max(actor.data_parallel_size(ranks), 1)
    share = max(-(-actor.mini_batch_rows(recipe.rollout.n) // data_parallel), 1)
    update_rows = actor.ppo_micro_batch_size_per_gpu or share
    log_prob_rows = actor.log_prob_micro_batch_size_per_gpu or update_rows

    def of(rows: int) -> MicroBatch:
        return MicroBatch(-(-rows * length // sp), -(-rows * response // sp))

    return of(update_rows), of(log_prob_rows)
