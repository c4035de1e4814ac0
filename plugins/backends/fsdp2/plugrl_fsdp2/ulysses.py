"""Ulysses sequence parallelism: each sequence of a micro-batch split over the ranks of a
sequence-parallel group (``actor.ulysses_sequence_parallel_size``).

Every rank of a group receives the same micro-batches and runs the model on its own slice of
the sequence dimension: embeddings, norms, MLPs and the head see ``1/sp`` of the tokens.
Attention needs the whole sequence, so the model runs with the ``plugrl_ulysses`` attention
implementation (:func:`ulysses_attention`), registered in transformers' attention interface: an
all-to-all turns the group's sequence slices of all heads into the whole sequence of
``1/sp`` of the heads, the model's own attention (SDPA, or the packed attention of
:mod:`plugrl_fsdp2.packing`) runs on those, and a second all-to-all turns the result back.
Hence the heads and the key-value heads must divide by ``sp`` (:func:`check_model`).

The per-token results (log-probs, entropies, values) are computed on each rank's slice and
gathered along the sequence (:func:`gather_sequence`).

A vision-language model's image tokens take their embeddings from the vision tower, which
needs each image whole: every rank of a group runs the model on the whole sequences and all
their images, and the model's language model gets this rank's slice of the merged embeddings
and of the (M-RoPE) positions (:func:`sliced_language_model`), so that the vision tower runs
once per rank on the full image inputs and everything after it on ``1/sp`` of the tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from plugrl.api import RecipeError
from plugrl_fsdp2 import packing

ATTENTION = "plugrl_ulysses"
"""The name :func:`ulysses_attention` is registered under in transformers' attention
interface (a model's ``config._attn_implementation``)."""

KEY = "actor.ulysses_sequence_parallel_size"

_GROUP: list[Any] = [None]
"""The sequence-parallel process group of the forward running in this process; None outside
:func:`sequence_group`. A process-wide value, not a context variable: on CUDA, autograd runs
backward (and the recomputation of checkpointed layers in it) on a thread of its own, which
must split attention as the forward did."""


def check_model(hf_config: Any, sp: int) -> None:
    """Raise a :class:`RecipeError` naming :data:`KEY` when the decoder of ``hf_config`` (a
    Hugging Face text config) cannot be split over ``sp`` ranks: every rank attends with
    ``1/sp`` of the query heads and of the key-value heads, and with plain causal attention
    built without a mask, which would ignore a sliding window."""
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    for count, what in ((heads, "attention heads"), (kv_heads, "key-value heads")):
        if count % sp:
            divisors = [d for d in range(1, count + 1) if count % d == 0]
            raise RecipeError(
                f"{sp} does not divide the model's {count} {what}, which the sequence-parallel "
                f"ranks share out; use one of {', '.join(map(str, divisors))}",
                key=KEY,
            )
    reason = packing.unpackable_reason(hf_config)
    if reason is not None:
        raise RecipeError(
            f"sequence parallelism needs full causal attention in every layer, but {reason}; "
            "set it to 1",
            key=KEY,
        )


def groups(device_type: str, world_size: int, sp: int) -> tuple[Any, Any]:
    """``(sequence-parallel group, data-parallel group)`` of this rank: ranks ``k x sp`` to
    ``k x sp + sp - 1`` form sequence-parallel group ``k`` (neighbours, which on one node
    share the fastest links); the data-parallel group joins the ranks of the same position
    in each."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (world_size // sp, sp), mesh_dim_names=("dp", "sp"))
    return mesh.get_group("sp"), mesh.get_group("dp")


@contextmanager
def sequence_group(group: Any) -> Iterator[None]:
    """Forwards inside the block, and the backward passes run inside it, split their attention
    over ``group``."""
    before = _GROUP[0]
    _GROUP[0] = group
    try:
        yield
    finally:
        _GROUP[0] = before


def current_group() -> Any:
    """The group of the innermost :func:`sequence_group` block, on any thread; None outside."""
    return _GROUP[0]


def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Cut ``x`` in ``sp`` pieces along ``scatter_dim``, send piece ``j`` to rank ``j`` of
    ``group``, and join the pieces received along ``gather_dim`` in rank order.

    One ``all_to_all_single`` of a stacked buffer: gloo runs it on the CPU, NCCL and HCCL on
    devices. It moves 1/sp of what an ``all_gather`` of whole slices then slicing would, and
    measured 1.7-2.2x faster on gloo (bench/bench_ulysses_exchange.py).
    """
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """:func:`_all_to_all` whose backward is the reverse exchange."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int
    ) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


class _GatherSequence(torch.autograd.Function):
    """The group's slices joined along ``dim``; backward keeps this rank's slice of the
    gradient, times the group size.

    Every rank of the group computes the same loss from the gathered values, and each takes
    the gradient of its own slice only, so the group's gradients sum to the micro-batch's
    gradient once. FSDP averages gradients over all ranks, the sequence-parallel ones
    included, which would divide that sum by ``sp``: the factor undoes it, so that gradients
    are the average over data-parallel ranks, as without sequence parallelism.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        size = dist.get_world_size(group)
        pieces = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        size = dist.get_world_size(ctx.group)
        rank = dist.get_rank(ctx.group)
        return grad.chunk(size, dim=ctx.dim)[rank] * size, None, None


def gather_sequence(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """The slices of the ranks of ``group`` joined along ``dim`` (see :class:`_GatherSequence`
    for the gradient)."""
    return _GatherSequence.apply(x, group, dim)


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over the whole sequence from ``[b, heads, s / sp, d]`` slices, for
    transformers' attention interface; returns ``[b, s / sp, heads, d]``.

    Queries, keys and values go to ``[b, heads / sp, s, d]`` by all-to-all, attend with
    :func:`plugrl_fsdp2.packing.varlen_attention` (causal SDPA, or within each packed row when
    the packed row boundaries are passed), and come back by the reverse all-to-all. Rows are
    padded on the right only, so a real token's causal window holds real tokens alone and no
    mask is needed. Outside :func:`sequence_group` it is that attention unsplit.
    """
    group = current_group()
    if group is None:
        return packing.varlen_attention(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    whole = [_AllToAll.apply(t, group, 1, 2) for t in (query, key, value)]
    out, _ = packing.varlen_attention(
        module, *whole, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )
    return _AllToAll.apply(out, group, 1, 2), None


@contextmanager
def sliced_language_model(language_model: torch.nn.Module, mine: slice) -> Iterator[None]:
    """Inside the block, ``language_model`` runs on the ``mine`` columns of the embeddings
    (``inputs_embeds`` ``[b, s, h]``) and the positions (``position_ids`` ``[..., b, s]``) it
    is called with. The slice is part of the autograd graph: the gradient of each rank's
    columns flows back to the embeddings and the vision tower, which then take the sum over
    the group's ranks as the gradients of any other weight do."""

    def take_slice(
        module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        embeds = kwargs.get("inputs_embeds")
        if args or embeds is None:
            raise RuntimeError(
                f"{type(module).__name__} was called without inputs_embeds as a keyword; "
                "sequence parallelism slices the merged text and image embeddings there, so "
                "the model family must name the module that takes them "
                "(MultimodalModel.language_model_names)"
            )
        kwargs["inputs_embeds"] = embeds[:, mine]
        positions = kwargs.get("position_ids")
        if positions is not None:
            kwargs["position_ids"] = positions[..., mine]
        return args, kwargs

    handle = language_model.register_forward_pre_hook(take_slice, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def register() -> None:
    """Make :data:`ATTENTION` a valid ``attn_implementation`` (idempotent). No mask function
    is registered with it, so models build no attention mask for it."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)
