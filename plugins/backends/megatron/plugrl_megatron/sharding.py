"""Cutting whole megatron weights into tensor-parallel shards and joining them again.

A tensor-parallel parameter is split along its ``partition_dim`` (0 for column-parallel
layers and the vocabulary, 1 for row-parallel layers). ``linear_fc1`` of a gated MLP is the
exception: each rank holds its slice of the gate above its slice of the up projection.
"""

from __future__ import annotations

import torch

_COLUMN_PARALLEL = (
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "mlp.linear_fc1.weight",
)
_ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


def partition_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits a dense GPT weight along; ``None`` for weights
    every tensor-parallel rank holds whole (norms). Decided by name: megatron marks its
    parameters only when it initialises them, and these are loaded instead."""
    if name.endswith(_COLUMN_PARALLEL):
        return 0
    if name.endswith(_ROW_PARALLEL):
        return 1
    return None


def _gated(name: str) -> bool:
    return name.endswith("mlp.linear_fc1.weight")


def shard(name: str, full: torch.Tensor, partition_dim: int, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's piece of the whole weight ``full``."""
    if size == 1:
        return full
    if full.shape[partition_dim] % (2 * size if _gated(name) else size):
        raise ValueError(
            f"{name} of shape {tuple(full.shape)} cannot be split evenly over {size} "
            "tensor-parallel ranks; choose a tensor_model_parallel_size that divides it"
        )
    if _gated(name):
        gate, up = full.chunk(2, dim=partition_dim)
        return torch.cat(
            [gate.chunk(size, dim=partition_dim)[rank], up.chunk(size, dim=partition_dim)[rank]],
            dim=partition_dim,
        ).contiguous()
    return full.chunk(size, dim=partition_dim)[rank].contiguous()


def unshard(name: str, pieces: list[torch.Tensor], partition_dim: int) -> torch.Tensor:
    """The whole weight from every tensor-parallel rank's piece, in rank order."""
    if len(pieces) == 1:
        return pieces[0]
    if _gated(name):
        halves = [piece.chunk(2, dim=partition_dim) for piece in pieces]
        gate = torch.cat([half[0] for half in halves], dim=partition_dim)
        up = torch.cat([half[1] for half in halves], dim=partition_dim)
        return torch.cat([gate, up], dim=partition_dim)
    return torch.cat(pieces, dim=partition_dim)
