"""Tensor parallelism of the ``hf`` engine over the devices of its span.

The model is split Megatron-style over the ranks of a ``torch.distributed`` group: each rank
holds a slice of the attention heads (column-parallel ``q_proj``, ``k_proj``, ``v_proj``, and
the matching input columns of ``o_proj``) and of the MLP's inner width (column-parallel
``gate_proj``, ``up_proj``, row-parallel ``down_proj``); the outputs of ``o_proj`` and
``down_proj`` are summed over the group, so every rank holds the whole hidden state, the same
logits and, for its own heads, its own KV cache. Embeddings, norms and the head are whole on
every rank.

The engine's actor is rank 0 and drives; the other ranks are :class:`TensorParallelWorker`
actors it starts on the other bundles of its span when the span crosses Ray nodes, or
processes of its own on the other devices it sees (:func:`run_local_rank`). They follow rank
0's running batch (:class:`LockstepBatch`) operation by operation: rank 0 broadcasts each
operation (rows that join or leave, a decode step, a prompt to score, a weight bucket), every
rank runs the same forward passes, and rank 0 samples and broadcasts the tokens, so the ranks'
caches never differ. Messages go over a gloo group (CPU tensors), whatever the device's own
backend does the forward's sums.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from plugrl.api import PluginError
from plugrl_hf.batch import DecodeBatch, Row

logger = logging.getLogger("plugrl.rollout.hf")

COLUMN = 0
"""A weight split along its output features (dimension 0): its bias is split the same way."""
ROW = 1
"""A weight split along its input features (dimension 1): its bias stays whole."""

_ATTENTION_SPLIT = {"q_proj": COLUMN, "k_proj": COLUMN, "v_proj": COLUMN, "o_proj": ROW}
_MLP_SPLIT = {"gate_proj": COLUMN, "up_proj": COLUMN, "down_proj": ROW}

JOIN_TIMEOUT = datetime.timedelta(minutes=10)


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split over the group: each rank multiplies
    its slice, the partial outputs are summed over the group, then the (whole) bias is
    added once."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, group: Any) -> None:
        super().__init__()
        columns = linear.in_features // world
        self.weight = nn.Parameter(
            linear.weight.detach()[:, rank * columns : (rank + 1) * columns].clone(),
            requires_grad=False,
        )
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        )
        self.group = group

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        output = nn.functional.linear(inputs, self.weight)
        dist.all_reduce(output, group=self.group)
        return output if self.bias is None else output + self.bias


def _column_slice(linear: nn.Linear, rank: int, world: int) -> nn.Linear:
    rows = linear.out_features // world
    part = nn.Linear(
        linear.in_features,
        rows,
        bias=linear.bias is not None,
        dtype=linear.weight.dtype,
        device=linear.weight.device,
    )
    with torch.no_grad():
        part.weight.copy_(linear.weight[rank * rows : (rank + 1) * rows])
        if linear.bias is not None:
            part.bias.copy_(linear.bias[rank * rows : (rank + 1) * rows])
    part.requires_grad_(False)
    return part


def tensor_parallel_unsupported(model: Any, world: int) -> str | None:
    """Why ``model`` cannot be split over ``world`` ranks (``None`` when it can)."""
    config = model.config
    if getattr(config, "vision_config", None) is not None:
        return "it is a vision-language model"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        return "it has no model.layers"
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % world or kv_heads % world:
        return f"its {heads} attention and {kv_heads} key-value heads do not divide by {world}"
    if config.intermediate_size % world:
        return f"its MLP width {config.intermediate_size} does not divide by {world}"
    for layer in layers:
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        for module, names in ((attention, _ATTENTION_SPLIT), (mlp, _MLP_SPLIT)):
            if module is None or any(
                type(getattr(module, name, None)) is not nn.Linear for name in names
            ):
                return (
                    "its layers are not self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj "
                    "plain linear layers (Llama, Qwen2, Qwen3, Mistral)"
                )
    return None


def shard_model(model: Any, rank: int, world: int, group: Any) -> dict[str, int]:
    """Split ``model`` in place for ``rank`` of ``world``; returns each split tensor's name
    and the dimension it is split along (the others are whole on every rank)."""
    reason = tensor_parallel_unsupported(model, world)
    if reason is not None:
        raise PluginError(
            f"the hf rollout engine cannot split {type(model).__name__} over "
            f"rollout.tensor_model_parallel_size={world} ranks: {reason}; use "
            "rollout.tensor_model_parallel_size=1 or another engine (vllm)"
        )
    config = model.config
    split: dict[str, int] = {}
    for index, layer in enumerate(model.model.layers):
        for owner, prefix, names in (
            (layer.self_attn, f"model.layers.{index}.self_attn", _ATTENTION_SPLIT),
            (layer.mlp, f"model.layers.{index}.mlp", _MLP_SPLIT),
        ):
            for name, kind in names.items():
                linear = getattr(owner, name)
                if kind == COLUMN:
                    setattr(owner, name, _column_slice(linear, rank, world))
                    split[f"{prefix}.{name}.weight"] = 0
                    if linear.bias is not None:
                        split[f"{prefix}.{name}.bias"] = 0
                else:
                    setattr(owner, name, RowParallelLinear(linear, rank, world, group))
                    split[f"{prefix}.{name}.weight"] = 1
    # what this rank's cache and attention hold: its share of the heads, of the same size
    config.head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    config.num_attention_heads //= world
    config.num_key_value_heads = kv_heads // world
    config.intermediate_size //= world
    return split


def shard_of(tensor: torch.Tensor, dim: int | None, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the whole ``tensor`` (all of it for ``dim`` ``None``)."""
    if dim is None:
        return tensor
    size = tensor.shape[dim] // world
    return tensor.narrow(dim, rank * size, size)


def full_shape(shape: Sequence[int], dim: int | None, world: int) -> tuple[int, ...]:
    """The whole tensor's shape of a shard of ``shape`` split along ``dim``."""
    whole = list(shape)
    if dim is not None:
        whole[dim] *= world
    return tuple(whole)


# ---------------------------------------------------------------------------- the channel


class Channel:
    """Rank 0's messages to the other ranks, over a gloo group."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def send(self, message: Any) -> None:
        dist.broadcast_object_list([message], src=0, group=self.group)

    def receive(self) -> Any:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def send_tensor(self, tensor: torch.Tensor) -> None:
        dist.broadcast(tensor.detach().cpu().contiguous(), src=0, group=self.group)

    def receive_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype)
        dist.broadcast(tensor, src=0, group=self.group)
        return tensor


def _row_spec(row: Row) -> tuple[tuple[int, ...], list[int], Any]:
    return row.prompt, list(row.tokens), row.params


def _mirror_row(spec: tuple[tuple[int, ...], list[int], Any]) -> Row:
    prompt, tokens, params = spec
    row = Row(
        owner=None,
        sample_index=0,
        prompt=prompt,
        params=params,
        seed=0,
        stop_ids=frozenset(),
        matcher=None,
        version=0,
    )
    row.tokens = tokens
    return row


class LockstepBatch(DecodeBatch):
    """Rank 0's running batch: each operation is sent to the other ranks before it runs, so
    their batches (:func:`follow`) run the same forward passes on their shards."""

    def __init__(self, model: Any, channel: Channel, **kwargs: Any) -> None:
        self.channel = channel
        super().__init__(model, **kwargs)

    def admit(self, rows: list[Row]) -> None:
        self.channel.send(("admit", [_row_spec(row) for row in rows]))
        super().admit(rows)

    def step(self) -> list[Row]:
        if self.stale:
            self.admit([])
        self.channel.send(("step",))
        logits = self.kv.forward_step(self.model, self.input_ids, self.positions)
        tokens, log_probs = self.sampling.pick(
            logits, [row.draw() for row in self.rows], self.never_sampled
        )
        finished = self._advance(tokens, log_probs)
        self.channel.send((tokens.tolist(), finished))
        return self._leave(finished)

    def remove(self, rows: Iterable[Row]) -> None:
        leaving = {id(row) for row in rows}
        indices = [i for i, row in enumerate(self.rows) if id(row) in leaving]
        if indices:
            self.channel.send(("remove", indices))
        super().remove(rows)

    def invalidate(self, *, free: bool = False) -> None:
        self.channel.send(("invalidate", free))
        super().invalidate(free=free)

    def adopt(self, rows: list[Row]) -> None:
        self.channel.send(("adopt", [_row_spec(row) for row in rows]))
        super().adopt(rows)

    def weights_changed(self) -> None:
        self.channel.send(("weights_changed",))
        super().weights_changed()

    def clear(self) -> None:
        self.channel.send(("clear",))
        super().clear()


def follow(batch: DecodeBatch, channel: Channel, handlers: dict[str, Any]) -> None:
    """Run rank 0's operations on this rank's ``batch`` until it sends ``close``; the
    operations that are not the batch's go to ``handlers`` (name -> function of the
    message's arguments)."""
    while True:
        operation, *arguments = channel.receive()
        if operation == "close":
            return
        if operation == "admit":
            DecodeBatch.admit(batch, [_mirror_row(spec) for spec in arguments[0]])
        elif operation == "step":
            batch.kv.forward_step(batch.model, batch.input_ids, batch.positions)
            tokens, finished = channel.receive()
            for row, token in zip(batch.rows, tokens, strict=True):
                row.tokens.append(token)
            batch.input_ids = torch.tensor(tokens, dtype=torch.long, device=batch.device)
            batch.positions += 1
            batch._leave(finished)
        elif operation == "remove":
            DecodeBatch.remove(batch, [batch.rows[i] for i in arguments[0]])
        elif operation == "invalidate":
            DecodeBatch.invalidate(batch, free=arguments[0])
        elif operation == "adopt":
            DecodeBatch.adopt(batch, [_mirror_row(spec) for spec in arguments[0]])
        elif operation == "weights_changed":
            DecodeBatch.weights_changed(batch)
        elif operation == "clear":
            DecodeBatch.clear(batch)
        else:
            handlers[operation](*arguments)


# ------------------------------------------------------------------------- the group itself


def ray_node_id() -> str | None:
    """The Ray node this process runs on (``None`` outside Ray)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def join_group(address: str, port: int, rank: int, world: int, backend: str) -> tuple[Any, Channel]:
    """Join the engine's group of ``world`` ranks (rank 0 at ``address:port``); returns the
    group of the forward's sums and rank 0's channel."""
    if dist.is_initialized():
        raise PluginError(
            "the hf rollout engine's tensor-parallel ranks need a process of their own, and "
            "this one is already in a torch.distributed group; run the engine on Ray "
            "(cluster.mode=ray)"
        )
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world,
        timeout=JOIN_TIMEOUT,
    )
    control = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
    return dist.group.WORLD, Channel(control)


class ShardedModel:
    """A rank's shard of the engine's model and how to give it a new version's weights."""

    def __init__(self, model: Any, rank: int, world: int, group: Any) -> None:
        self.whole_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self.split = shard_model(model, rank, world, group)
        self.model = model
        self.rank = rank
        self.world = world

    def whole(self, name: str, group: Any) -> torch.Tensor:
        """The weight ``name`` whole, gathered from every rank's slice (every rank calls
        it, in the same order)."""
        local = self.model.state_dict()[name].detach()
        dim = self.split.get(name)
        if dim is None:
            return local
        parts = [torch.empty_like(local, device="cpu") for _ in range(self.world)]
        dist.all_gather(parts, local.cpu().contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    def load(self, name: str, whole: torch.Tensor) -> None:
        """Copy this rank's slice of the whole tensor ``whole`` into the weight ``name``."""
        target = self.model.state_dict()[name]
        with torch.no_grad():
            target.copy_(shard_of(whole, self.split.get(name), self.rank, self.world))


def run_local_rank(
    recipe: Any,
    rank: int,
    world: int,
    device: str,
    backend: str,
    config: Any,
    dtype: torch.dtype,
    pad_token_id: int,
    address: str,
    port: int,
) -> None:
    """Rank ``rank`` as a process of the engine's own (an engine of one node's devices)."""
    import os
    import sys

    TensorParallelWorker(recipe, rank, world, device, backend, config, dtype, pad_token_id).run(
        address, port
    )
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads may abort the process at interpreter exit, which says nothing here
    os._exit(0)


class TensorParallelWorker:
    """Rank ``rank`` (> 0) of an hf engine's tensor-parallel group: its shard of the model,
    on its device, following rank 0's batch (a Ray actor on a bundle of the engine's span,
    or a process of the engine's own, :func:`run_local_rank`)."""

    def __init__(
        self,
        recipe: Any,
        rank: int,
        world: int,
        device: str,
        backend: str,
        config: Any,
        dtype: torch.dtype,
        pad_token_id: int,
    ) -> None:
        self.recipe = recipe
        self.rank = rank
        self.world = world
        self.device = torch.device(device)
        self.backend = backend
        self.config = config
        self.dtype = dtype
        self.pad_token_id = pad_token_id

    def run(self, address: str, port: int) -> None:
        """Join the group, load and split the model, then follow rank 0 until it closes."""
        from plugrl_hf.engine import load_model

        if self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        group, channel = join_group(address, port, self.rank, self.world, self.backend)
        try:
            failure = None
            try:
                # loaded on the CPU: only this rank's share goes to the device
                model = load_model(
                    self.recipe, torch.device("cpu"), self.config.attn_implementation, self.dtype
                )
                self.shard = ShardedModel(model, self.rank, self.world, group)
                self.shard.model.to(self.device)
            except Exception as error:
                failure = f"rank {self.rank}: {error}"
            # rank 0 learns whether every rank is ready (and stops if one is not)
            ready: list[Any] = [None] * self.world
            dist.all_gather_object(ready, (failure, ray_node_id()), group=channel.group)
            if any(f is not None for f, _ in ready):
                return
            batch = DecodeBatch(
                self.shard.model,
                device=self.device,
                pad_token_id=self.pad_token_id,
                max_rows=self.config.max_num_seqs,
                prefill_tokens=self.config.max_prefill_tokens,
                lean_decode=False,
            )
            follow(
                batch,
                channel,
                {
                    "score": self._score,
                    "load": lambda metas: self._load(channel, metas),
                    "gather": lambda names: [self.shard.whole(n, channel.group) for n in names],
                    "sleep": self._sleep,
                    "wake_up": self._wake_up,
                },
            )
        finally:
            dist.destroy_process_group()

    def _score(self, tokens: list[int]) -> None:
        with torch.no_grad():
            self.shard.model(
                input_ids=torch.tensor([tokens], dtype=torch.long, device=self.device),
                use_cache=False,
            )

    def _load(self, channel: Channel, metas: list[tuple[str, tuple[int, ...], Any]]) -> None:
        for name, shape, dtype in metas:
            self.shard.load(name, channel.receive_tensor(shape, dtype))

    def _sleep(self, level: int) -> None:
        if level == 1:
            self.shard.model.to("cpu")
        else:
            self._shapes = {n: (p.shape, p.dtype) for n, p in self.shard.model.named_parameters()}
            with torch.no_grad():
                for parameter in self.shard.model.parameters():
                    parameter.data = parameter.data.new_empty(0)
        self._level = level
        if self.device.type != "cpu":
            getattr(torch, self.device.type).empty_cache()

    def _wake_up(self) -> None:
        if getattr(self, "_level", 1) == 2:
            with torch.no_grad():
                for name, parameter in self.shard.model.named_parameters():
                    shape, dtype = self._shapes[name]
                    parameter.data = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            self.shard.model.to(self.device)
