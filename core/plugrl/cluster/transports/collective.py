"""The ``collective`` weight transport: the trainer rank that yields the weights broadcasts each
bucket to every engine worker over a process group of its own.

The group is the sending rank (group rank 0) and the engine workers being updated (ranks 1..n,
in engine order), on the device's collective backend (``Device.dist_backend``: gloo on the
CPU, nccl on CUDA, and hccl or any other backend that torch_npu or a plugin registers with
``torch.distributed.Backend.register_backend``). It is made for one push and torn down after:
a ``torch.distributed.TCPStore`` hosted by the sending rank on a port the OS picks, and a
process-group object built on it directly, so neither side's default process group (the
trainer's FSDP group, an engine's own) is touched. Making it costs every push a rendezvous
(20-35 ms with gloo on a CPU; an NCCL communicator takes longer), and an engine restarted
between pushes simply joins the next one.

One push, as the driver runs it:

1. ``trainer.weight_metadata()``, then ``begin_weight_update`` on the engines;
2. :class:`Listen` on the trainer ranks: rank 0 opens the store and answers its address;
3. ``engines.transport_receive`` with a :class:`Receive` per engine: each connects, says it has
   joined, and builds its end of the group;
4. :class:`Send` on the trainer ranks: rank 0 waits until every engine joined, builds the
   group and streams :meth:`TrainingBackend.weight_buckets
   <plugrl.parts.backend.TrainingBackend.weight_buckets>`; the other ranks run the generator
   alongside (it is collective: FSDP gathers every weight to rank 0);
5. wait for both sides, then ``finish_weight_update``.

Per bucket, rank 0 broadcasts a header, an int64 tensor of ``2 + len(weights)`` entries
(``count``, ``nbytes``, then the ``count`` indices of the bucket's weights in the announced
list), and one flat byte buffer of ``nbytes`` bytes: the weights' bytes in header order, each
starting at a multiple of :data:`ALIGN` bytes, so tensors of several dtypes share the buffer. A
header with ``count == 0`` ends the push; ``count == -1`` says the sender failed (its error is
the trainer's). Receivers rebuild each tensor as a view of the buffer from the announced
:class:`~plugrl.parts.rollout.WeightMeta` and hand the bucket to ``engine.load_weights``, and
receive the next bucket while the engine loads the current one. An engine may keep the tensors
it is given: a receive buffer takes a later bucket only when the engine kept no view of it
(engines that copy the weights into their own storage, as engines do, get no new buffer after
the first two). Buffers live on the device (``Device.torch_device()``); at most two buckets are
in flight on either side.

Limits: **one sending rank**, trainer rank 0, as for backends that gather the full weights to
one rank (fsdp2). A backend whose weights come from several ranks (pipeline stages) needs
another transport (``object_store``): a push fails with one line when a rank other than 0
yields weights, and ``unusable_reason`` says so up front when the recipe sets
``actor.pipeline_model_parallel_size`` above 1. Engines that share the trainer's accelerators
(``rollout.colocate``) cannot use it either: NCCL and HCCL refuse two ranks of one group on one
device (on the CPU, gloo does not care). Every blocking step (joining, each broadcast) gives
up after ``rollout.update_weights_timeout_s``; an engine worker that fails before joining ends
the push at once with its own error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.errors import PluginError, PlugrlError
from plugrl.parts.rollout import WeightMeta
from plugrl.parts.transport import WeightTransport, weight_sync_metrics

if TYPE_CHECKING:
    import torch

    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.engines import EngineGroup
    from plugrl.parts.backend import TrainingBackend
    from plugrl.parts.rollout import RolloutEngine

NAME = "collective"
ALIGN = 16
"""Every weight starts at a multiple of this many bytes of a bucket's buffer (so that a view of
any dtype is aligned)."""
TIMEOUT_KEY = "rollout.update_weights_timeout_s"
END, ABORT = 0, -1
_JOINED = "joined/{}"
_ABANDON = "abandon"
_POLL_S = 0.05
FIX = "use rollout.weight_transport=object_store"


# --------------------------------------------------------------------------------------------
# What the driver hands each side
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Listen:
    """Trainer ranks, first call: rank 0 opens the store of push ``session``."""

    session: str
    timeout_s: float


@attrs.frozen
class Send:
    """Trainer ranks, second call: rank 0 sends ``weights`` to ``world_size - 1`` engines."""

    session: str
    world_size: int
    weights: tuple[WeightMeta, ...]
    bucket_bytes: int
    timeout_s: float


@attrs.frozen
class Receive:
    """One engine worker: join the group at ``host:port`` as ``rank`` and load every bucket."""

    session: str
    host: str
    port: int
    rank: int
    world_size: int
    weights: tuple[WeightMeta, ...]
    timeout_s: float


# --------------------------------------------------------------------------------------------
# The wire format
# --------------------------------------------------------------------------------------------


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def bucket_layout(weights: Sequence[WeightMeta], indices: Sequence[int]) -> tuple[list[int], int]:
    """Where each weight of a bucket starts in its buffer, and the buffer's size."""
    offsets, end = [], 0
    for index in indices:
        offsets.append(end)
        end += aligned(weights[index].nbytes)
    return offsets, end


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as a flat uint8 tensor (a view when it is contiguous)."""
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def unpack(
    buffer: torch.Tensor, weights: Sequence[WeightMeta], indices: Sequence[int]
) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of a bucket, as views of its byte buffer."""
    import torch

    offsets, _ = bucket_layout(weights, indices)
    bucket = []
    for index, offset in zip(indices, offsets, strict=True):
        meta = weights[index]
        piece = buffer[offset : offset + meta.nbytes]
        bucket.append((meta.name, piece.view(getattr(torch, meta.dtype)).view(meta.shape)))
    return bucket


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


# --------------------------------------------------------------------------------------------
# Process groups outside torch.distributed's world
# --------------------------------------------------------------------------------------------


def new_group(backend: str, store: Any, rank: int, size: int, timeout_s: float, name: str) -> Any:
    """A process group of ``size`` ranks of collective backend ``backend`` on ``store``, not
    registered with ``torch.distributed`` (no default group needed, none changed)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise PluginError(
                f"this torch has no NCCL, so the collective transport cannot run; {FIX}"
            )
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        with contextlib.suppress(AttributeError):
            options.group_name = name
        return dist.ProcessGroupNCCL(store, rank, size, options)
    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is None:
        raise PluginError(
            f"torch knows no collective backend {backend!r} in this process (is the device's "
            f"torch plugin, such as torch_npu for hccl, installed?); {FIX}"
        )
    if not plugin.extended_api:
        return plugin.creator_fn(store, rank, size, timeout)
    options = dist.distributed_c10d._DistributedBackendOptions()
    options.store = store
    options.group_rank = rank
    options.group_size = size
    options.timeout = timeout
    options.group_id = name
    options.global_ranks_in_group = list(range(size))
    return plugin.creator_fn(options, None)


def close_group(group: Any) -> None:
    shutdown = getattr(group, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()


def broadcast(group: Any, tensor: torch.Tensor) -> Any:
    """Start broadcasting ``tensor`` from group rank 0; returns the work to wait on."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    return group.broadcast([tensor], options)


def connect(host: str, port: int, timeout_s: float) -> Any:
    """A client of the store at ``host:port`` (loopback when it is on this machine)."""
    import torch.distributed as dist

    from plugrl.cluster.worker import node_ip

    if host == node_ip():
        host = "127.0.0.1"
    return dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# stores rank 0 opened for pushes whose Send has not come yet: session -> (store, opened at)
_LISTENING: dict[str, tuple[Any, float]] = {}


# --------------------------------------------------------------------------------------------
# The transport
# --------------------------------------------------------------------------------------------


class CollectiveTransport(WeightTransport):
    """Trainer rank 0 broadcasts each bucket of weights to the engine workers over a process
    group of its own, on the device's collective backend (nccl, hccl, gloo on the CPU).

    One sending rank: backends that gather the full weights to rank 0 (fsdp2). See the module
    docstring for the protocol and its limits.
    """

    name = NAME

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        self.timeout_s: float = config.update_weights_timeout_s
        """Seconds any step of a push may wait (engines joining, each broadcast)."""

    @classmethod
    def unusable_reason(cls, trainer: WorkerGroup, engines: EngineGroup) -> str | None:
        if trainer.in_process or engines.in_process:
            return "it needs the trainer and the engines in processes of their own (cluster: ray)"
        rollout = getattr(engines.recipe, "rollout", None)
        device = getattr(engines, "device_name", "cpu")
        if getattr(rollout, "colocate", False) and device != "cpu":
            return (
                f"the engines share the trainer's {device} devices (rollout.colocate: true), and "
                "a collective group cannot hold two ranks on one device; set "
                "rollout.colocate=false or use another transport"
            )
        stages = getattr(trainer.recipe.actor, "pipeline_model_parallel_size", 1) or 1
        if stages > 1:
            return (
                f"the trainer's weights come from each of its {stages} pipeline stages, and "
                "this transport sends from one rank (trainer rank 0)"
            )
        return None

    # ------------------------------------------------------------------ driver

    def push(
        self,
        trainer: WorkerGroup,
        engines: EngineGroup,
        version: int,
        *,
        engine_indices: Sequence[int] | None = None,
    ) -> dict[str, float]:
        start = time.perf_counter()
        weights = tuple(trainer.weight_metadata())
        targets = list(range(engines.num_engines) if engine_indices is None else engine_indices)
        engines.begin_weight_update(version, weights, engine_indices)
        session = uuid.uuid4().hex
        timeout_s = self.timeout_s
        world_size = 1 + len(targets)
        answers = trainer.transport_send(self.name, Listen(session, timeout_s))
        host, port = next(answer for answer in answers if answer is not None)
        receiving = engines.transport_receive(
            self.name,
            [
                Receive(session, host, port, rank, world_size, weights, timeout_s)
                for rank in range(1, world_size)
            ],
            engine_indices,
        )
        send = Send(session, world_size, weights, self.bucket_bytes, timeout_s)
        with concurrent.futures.ThreadPoolExecutor(1, "plugrl-collective-send") as pool:
            sending = pool.submit(trainer.transport_send, self.name, send)
            concurrent.futures.wait(
                [sending, receiving], return_when=concurrent.futures.FIRST_EXCEPTION
            )
            if receiving.done() and receiving.exception() is not None and not sending.done():
                # an engine worker failed, most likely before joining: stop the sender waiting
                # for it (it gives up by itself after the timeout otherwise)
                abandon(host, port, one_line(receiving.exception()))
            try:
                sending.result()
            except BaseException as sent:
                # the receivers end by themselves (an abort header, a broken group or the
                # timeout); an engine worker's own plugrl error is the cause when it has one
                with contextlib.suppress(BaseException):
                    receiving.result(timeout=5)
                failed = receiving.exception() if receiving.done() else None
                if isinstance(failed, PlugrlError):
                    raise failed from None
                raise sent
        try:
            receiving.result(timeout=timeout_s + 60)
        except concurrent.futures.TimeoutError:
            raise PluginError(
                f"the engine workers still had not loaded the weights {timeout_s + 60:g} s after "
                f"the trainer sent the last of them; see their logs, raise {TIMEOUT_KEY}, or "
                f"{FIX}"
            ) from None
        engines.finish_weight_update(engine_indices)
        seconds = time.perf_counter() - start
        megabytes = sum(weight.nbytes for weight in weights) / 2**20
        return weight_sync_metrics(megabytes, seconds)

    # ------------------------------------------------------------------ trainer ranks

    def send(self, backend: TrainingBackend, session: Any) -> Any:
        if isinstance(session, Listen):
            return self._listen(backend, session)
        if not isinstance(session, Send):
            raise TypeError(f"the collective transport cannot send a {type(session).__name__}")
        if backend.dist.rank == 0:
            return _Sender(backend, session).run()
        # the buckets are collective (rank 0 gathers from every rank): run them to their end
        extra = [
            name for bucket in backend.weight_buckets(session.bucket_bytes) for name, _ in bucket
        ]
        if extra:
            raise PluginError(
                f"trainer rank {backend.dist.rank} yielded weights ({extra[0]}, ...), but the "
                "collective transport sends from trainer rank 0 only; "
                f"{FIX} for a backend whose weights come from several ranks"
            )
        return None

    def _listen(self, backend: TrainingBackend, session: Listen) -> tuple[str, int] | None:
        if backend.dist.rank != 0:
            return None
        import torch.distributed as dist

        from plugrl.cluster.worker import node_ip

        now = time.monotonic()
        for stale, (_, opened) in list(_LISTENING.items()):
            if now - opened > 2 * session.timeout_s:
                _LISTENING.pop(stale, None)
        host = node_ip()
        store = dist.TCPStore(
            host,
            0,
            None,
            True,
            timeout=datetime.timedelta(seconds=session.timeout_s),
            wait_for_workers=False,
        )
        _LISTENING[session.session] = (store, now)
        return host, int(store.port)

    # ------------------------------------------------------------------ engine workers

    async def receive(self, engine: RolloutEngine, session: Any) -> Any:
        if not isinstance(session, Receive):
            raise TypeError(f"the collective transport cannot receive a {type(session).__name__}")
        return await _Receiver(self.context.device, engine, session).run()


def abandon(host: str, port: int, reason: str) -> None:
    """Tell a sender waiting for engines to join that they will not (best effort)."""
    with contextlib.suppress(Exception):
        connect(host, port, 5.0).set(_ABANDON, reason)


# --------------------------------------------------------------------------------------------
# Trainer rank 0
# --------------------------------------------------------------------------------------------


class _Sender:
    def __init__(self, backend: TrainingBackend, session: Send) -> None:
        self.backend = backend
        self.session = session
        self.device = backend.device.torch_device(backend.dist.local_rank)
        self.index = {weight.name: i for i, weight in enumerate(session.weights)}
        self.sent: set[int] = set()
        # two slots of (header, buffer, works): one being broadcast while the next is packed
        self.slots: list[list[Any]] = [[None, None, []], [None, None, []]]

    def run(self) -> int:
        session = self.session
        entry = _LISTENING.pop(session.session, None)
        buckets = self.backend.weight_buckets(session.bucket_bytes)
        if entry is None:
            _drain(buckets)
            raise PluginError(
                "trainer rank 0 has no open weight transfer for this push (the rank was "
                f"restarted between the two calls?); push again, or {FIX}"
            )
        store, _ = entry
        group = None
        try:
            try:
                self._wait_for_engines(store)
                group = new_group(
                    self.backend.device.dist_backend,
                    store,
                    0,
                    session.world_size,
                    session.timeout_s,
                    f"plugrl-weights-{session.session}",
                )
            except BaseException:
                _drain(buckets)
                raise
            return self._stream(group, buckets)
        finally:
            if group is not None:
                close_group(group)
            del store

    def _wait_for_engines(self, store: Any) -> None:
        session = self.session
        keys = [_JOINED.format(rank) for rank in range(1, session.world_size)]
        deadline = time.monotonic() + session.timeout_s
        pause = 0.001
        while not store.check(keys):
            if store.check([_ABANDON]):
                reason = store.get(_ABANDON).decode(errors="replace")
                raise PluginError(f"an engine worker failed to join the weight transfer: {reason}")
            if time.monotonic() > deadline:
                missing = [rank for rank, key in enumerate(keys, 1) if not store.check([key])]
                raise PluginError(
                    f"{len(missing)} of {len(keys)} engine workers (group ranks "
                    f"{', '.join(map(str, missing))}) did not join the weight transfer within "
                    f"{session.timeout_s:g} s; see their logs (are they alive, can they reach "
                    f"this machine?), raise {TIMEOUT_KEY}, or {FIX}"
                )
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S)

    def _stream(self, group: Any, buckets: Iterator[list[tuple[str, Any]]]) -> int:
        import torch

        session = self.session
        sent_bytes = 0
        try:
            for number, bucket in enumerate(buckets):
                header, buffer = self._pack(number % 2, bucket)
                slot = self.slots[number % 2]
                slot[2] = [broadcast(group, header)]
                if buffer is not None:
                    slot[2].append(broadcast(group, buffer))
                    sent_bytes += buffer.numel()
            missing = [w.name for i, w in enumerate(session.weights) if i not in self.sent]
            if missing:
                raise PluginError(
                    f"trainer rank 0 yielded {len(self.sent)} of the {len(session.weights)} "
                    f"announced weights (missing {', '.join(missing[:3])}"
                    f"{', ...' if len(missing) > 3 else ''}); the collective transport sends "
                    f"from rank 0 only: {FIX} for a backend whose weights come from several ranks"
                )
            self._wait_all()
            end = torch.zeros(2 + len(session.weights), dtype=torch.int64, device=self.device)
            broadcast(group, end).wait()
            return sent_bytes
        except BaseException as exc:
            _drain(buckets)
            if isinstance(exc, PlugrlError):
                # the group still works: tell the engines to stop waiting
                with contextlib.suppress(Exception):
                    self._wait_all()
                    header = torch.zeros(
                        2 + len(session.weights), dtype=torch.int64, device=self.device
                    )
                    header[0] = ABORT
                    broadcast(group, header).wait()
                raise
            raise PluginError(
                f"sending weights to the engine workers failed ({one_line(exc)}); an engine "
                f"worker may have died (see its log), or {FIX}"
            ) from exc

    def _wait_all(self) -> None:
        for slot in self.slots:
            for work in slot[2]:
                work.wait()
            slot[2] = []

    def _pack(self, slot_number: int, bucket: list[tuple[str, Any]]) -> tuple[Any, Any]:
        """Header and buffer of one bucket, in slot ``slot_number`` (after its last broadcast
        finished)."""
        import torch

        session = self.session
        slot = self.slots[slot_number]
        for work in slot[2]:
            work.wait()
        slot[2] = []
        indices = []
        for name, tensor in bucket:
            index = self.index.get(name)
            if index is None:
                raise PluginError(
                    f"trainer rank 0 yielded weight {name!r}, which weight_metadata() did not "
                    "announce; the backend's weight_metadata and named_weights must agree"
                )
            meta = session.weights[index]
            if tuple(tensor.shape) != meta.shape or dtype_name(tensor) != meta.dtype:
                raise PluginError(
                    f"trainer rank 0 yielded {name} as {dtype_name(tensor)} "
                    f"{tuple(tensor.shape)}, announced as {meta.dtype} {meta.shape}; the "
                    "backend's weight_metadata and named_weights must agree"
                )
            if index in self.sent:
                raise PluginError(f"trainer rank 0 yielded weight {name!r} twice in one push")
            self.sent.add(index)
            indices.append(index)
        offsets, nbytes = bucket_layout(session.weights, indices)
        header = torch.zeros(2 + len(session.weights), dtype=torch.int64)
        header[0], header[1] = len(indices), nbytes
        header[2 : 2 + len(indices)] = torch.tensor(indices, dtype=torch.int64)
        header = slot[0] = header.to(self.device)
        if not indices:
            return header, None
        buffer = slot[1]
        if buffer is None or buffer.numel() < nbytes:
            buffer = slot[1] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        # the receivers' buffers are exactly nbytes long: broadcast exactly that many bytes
        buffer = buffer[:nbytes]
        for (_, tensor), offset in zip(bucket, offsets, strict=True):
            data = as_bytes(tensor)
            buffer[offset : offset + data.numel()].copy_(data)
        return header, buffer


def _drain(buckets: Iterator[Any]) -> None:
    """Run a collective generator to its end (the other ranks are waiting in it)."""
    with contextlib.suppress(Exception):
        for _ in buckets:
            pass


# --------------------------------------------------------------------------------------------
# Engine workers
# --------------------------------------------------------------------------------------------


class _Buffer:
    """A receive buffer, and how many references its storage has while nothing else uses it
    (``None`` where torch cannot tell: then it is never reused)."""

    def __init__(self, nbytes: int, device: Any) -> None:
        import torch

        self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.alone = _storage_users(self.tensor)

    def unshared(self) -> bool:
        return self.alone is not None and _storage_users(self.tensor) == self.alone


def _storage_users(tensor: torch.Tensor) -> int | None:
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    try:
        return int(count(tensor.untyped_storage()._cdata))
    except Exception:
        return None


class _Receiver:
    def __init__(self, device: Any, engine: RolloutEngine, session: Receive) -> None:
        self.device = device
        self.torch_device = device.torch_device()
        self.engine = engine
        self.session = session
        self.group: Any = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        session = self.session
        store = None
        try:
            store = await loop.run_in_executor(None, self._join)
            received = 0
            failure: BaseException | None = None
            # buffers of buckets the engine loaded: the next bucket takes one it kept no part
            # of (looked at a bucket later, when the group no longer holds it either)
            loaded: list[_Buffer] = []
            incoming = loop.run_in_executor(None, self._receive_bucket, None)
            while True:
                count, buffer, nbytes, indices = await incoming
                if count == END:
                    break
                if count == ABORT:
                    raise PluginError(
                        "the trainer stopped sending weights part-way (its error says why)"
                    )
                # receive the next bucket while the engine loads this one
                incoming = loop.run_in_executor(None, self._receive_bucket, self._spare(loaded))
                received += nbytes
                if failure is None:
                    try:
                        bucket = unpack(buffer.tensor[:nbytes], session.weights, indices)
                        await self.engine.load_weights(bucket)
                    except BaseException as exc:
                        # keep receiving to the end, so the sender is not left waiting
                        failure = exc
                    finally:
                        bucket = []
                loaded.append(buffer)
                del loaded[:-2]
            if failure is not None:
                if isinstance(failure, PlugrlError):
                    raise failure
                raise PluginError(
                    f"engine worker (group rank {session.rank}) could not load the weights it "
                    f"received: {one_line(failure)}"
                ) from failure
            return received
        except PlugrlError:
            raise
        except Exception as exc:
            raise PluginError(
                f"engine worker (group rank {session.rank}) failed to receive weights from "
                f"{session.host}:{session.port} ({one_line(exc)}); see the trainer's log, raise "
                f"{TIMEOUT_KEY} if it was only slow, or {FIX}"
            ) from exc
        finally:
            if self.group is not None:
                close_group(self.group)
            del store

    def _spare(self, loaded: list[_Buffer]) -> _Buffer | None:
        """A loaded bucket's buffer the engine kept no view of, once the device is done with
        it, or None."""
        for position, buffer in enumerate(loaded):
            if buffer.unshared():
                del loaded[position]
                self.device.synchronize()
                return buffer
        return None

    def _join(self) -> Any:
        session = self.session
        store = connect(session.host, session.port, session.timeout_s)
        store.set(_JOINED.format(session.rank), "1")
        self.group = new_group(
            self.device.dist_backend,
            store,
            session.rank,
            session.world_size,
            session.timeout_s,
            f"plugrl-weights-{session.session}",
        )
        return store

    def _receive_bucket(self, spare: _Buffer | None) -> tuple[int, Any, int, list[int]]:
        """The next bucket: its weight count (or END, ABORT), buffer, size and weights."""
        import torch

        weights = self.session.weights
        header = torch.empty(2 + len(weights), dtype=torch.int64, device=self.torch_device)
        broadcast(self.group, header).wait()
        values = header.tolist()
        count, nbytes = int(values[0]), int(values[1])
        if count <= 0:
            return count, None, 0, []
        indices = [int(i) for i in values[2 : 2 + count]]
        if any(not 0 <= i < len(weights) for i in indices):
            raise PluginError(
                f"a weight bucket names weights {indices} of {len(weights)} announced"
            )
        _, expected = bucket_layout(weights, indices)
        if expected != nbytes:
            raise PluginError(
                f"a weight bucket announces {nbytes} bytes, its weights take {expected}; the "
                "trainer and the engines run different plugrl versions?"
            )
        buffer = spare if spare is not None and spare.tensor.numel() >= nbytes else None
        if buffer is None:
            buffer = _Buffer(nbytes, self.torch_device)
        broadcast(self.group, buffer.tensor[:nbytes]).wait()
        self.device.synchronize()
        return count, buffer, nbytes, indices
