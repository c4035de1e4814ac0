"""Where a rank sits in megatron-core's process grid, from the sizes alone.

The worker group asks a backend for its data-parallel index and whether it holds outputs as
soon as it is built, before ``setup`` creates megatron's groups; megatron's default rank order
``tp-cp-ep-dp-pp`` (tensor parallelism varies fastest, pipeline stages slowest) lets the
answer be computed here, and ``setup`` checks it against megatron's own.
"""

from __future__ import annotations

import attrs

from plugrl.api import RecipeError


@attrs.frozen
class GridPosition:
    tp_rank: int
    cp_rank: int
    dp_rank: int
    pp_rank: int
    tp_size: int
    cp_size: int
    dp_size: int
    pp_size: int

    @property
    def is_output_rank(self) -> bool:
        """The first tensor- and context-parallel rank of the last pipeline stage: the rank
        whose log-probs, losses and metrics are its data-parallel shard's."""
        return self.tp_rank == 0 and self.cp_rank == 0 and self.pp_rank == self.pp_size - 1


def data_parallel_size(world_size: int, tp: int, pp: int, cp: int) -> int:
    """Model copies among ``world_size`` ranks, as megatron-core counts them: the ranks over
    tensor x pipeline x context parallel sizes."""
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise RecipeError(
            f"{world_size} ranks cannot hold tensor x pipeline x context parallel = {tp} x {pp} x "
            f"{cp} = {model_parallel} ranks per model copy; make the role's rank count a "
            f"multiple of {model_parallel}",
            key="actor.tensor_model_parallel_size",
        )
    return world_size // model_parallel


def grid_position(rank: int, world_size: int, tp: int, pp: int, cp: int) -> GridPosition:
    dp = data_parallel_size(world_size, tp, pp, cp)
    return GridPosition(
        tp_rank=rank % tp,
        cp_rank=(rank // tp) % cp,
        dp_rank=(rank // (tp * cp)) % dp,
        pp_rank=rank // (tp * cp * dp),
        tp_size=tp,
        cp_size=cp,
        dp_size=dp,
        pp_size=pp,
    )
