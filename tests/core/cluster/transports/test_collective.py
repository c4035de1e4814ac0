"""The ``collective`` transport's two sides in one process: the trainer rank and the engine
receivers in threads of their own, over a real gloo group on loopback. The Ray tests
(``test_collective_ray.py``) run the same through worker and engine groups."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from types import SimpleNamespace

import pytest
import torch

from plugrl.cluster.transports import collective
from plugrl.cluster.transports.collective import (
    ALIGN,
    TIMEOUT_KEY,
    CollectiveTransport,
    Listen,
    Receive,
    Send,
    abandon,
    bucket_layout,
    unpack,
)
from plugrl.errors import PluginError
from plugrl.parts.context import DistInfo, PartContext
from plugrl.parts.rollout import RolloutConfig, WeightMeta
from plugrl.recipe import Recipe
from plugrl.testing import part_context
from plugrl_cpu.device import CpuDevice
from tests.core.cluster.transports import transport_fake_backend
from tests.core.cluster.transports.transport_fake_backend import make_weights

MIB = 2**20
MIXED = [
    ("embed", (64, 32), "bfloat16"),
    ("norm", (33,), "float32"),  # odd sizes: the next weight starts on an aligned byte
    ("layer.0", (17, 3), "bfloat16"),
    ("steps", (), "int64"),
    ("layer.1", (32, 32), "float32"),
]


class Recorder:
    """An engine that keeps a copy of every bucket it is given (or fails on one)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.buckets: list[list[tuple[str, torch.Tensor]]] = []
        self.fail_on = fail_on

    async def load_weights(self, bucket):
        if len(self.buckets) == self.fail_on:
            self.buckets.append([])
            raise ValueError("this engine has no room for them")
        self.buckets.append([(name, tensor.clone()) for name, tensor in bucket])

    def received(self) -> list[tuple[str, torch.Tensor]]:
        return [weight for bucket in self.buckets for weight in bucket]


def make_backend(rank: int = 0, world_size: int = 1) -> transport_fake_backend.WeightsBackend:
    context = PartContext(
        recipe=Recipe(),
        role="actor",
        device=CpuDevice(),
        dist=DistInfo(rank=rank, world_size=world_size),
    )
    return transport_fake_backend.WeightsBackend(Recipe().actor, context)


def make_transport(bucket_megabytes: int = 1, timeout_s: float = 20) -> CollectiveTransport:
    config = RolloutConfig(update_weights_bucket_megabytes=bucket_megabytes)
    transport = CollectiveTransport(config, part_context(device=CpuDevice()))
    transport.timeout_s = timeout_s
    return transport


def transfer(backend, engines, *, transport=None, joining=None, weights=None):
    """Run one push's two worker sides: ``send`` on ``backend`` as trainer rank 0 and
    ``receive`` in each engine (group ranks ``joining``, all by default). Returns the sender's
    and the receivers' futures, done."""
    transport = transport or make_transport()
    weights = tuple(weights or backend.weight_metadata())
    session, timeout_s, world = uuid.uuid4().hex, transport.timeout_s, 1 + len(engines)
    host, port = transport.send(backend, Listen(session, timeout_s))
    joining = range(1, world) if joining is None else joining
    with concurrent.futures.ThreadPoolExecutor(world) as pool:
        receivers = [
            pool.submit(
                asyncio.run,
                transport.receive(
                    engines[rank - 1], Receive(session, host, port, rank, world, weights, timeout_s)
                ),
            )
            for rank in joining
        ]
        send = Send(session, world, weights, transport.bucket_bytes, timeout_s)
        sender = pool.submit(transport.send, backend, send)
        concurrent.futures.wait([sender, *receivers])
    return sender, receivers


def assert_same(received, expected):
    assert [name for name, _ in received] == [name for name, _ in expected]
    for (name, got), (_, want) in zip(received, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name


# ---------------------------------------------------------------------------- the wire format


def test_every_weight_of_a_bucket_starts_aligned_and_unpacks_to_its_dtype_and_shape():
    metas = [WeightMeta(name, shape, dtype) for name, shape, dtype in MIXED]
    offsets, nbytes = bucket_layout(metas, [0, 1, 2, 3, 4])
    assert offsets == [0, 4096, 4096 + 144, 4096 + 144 + 112, 4096 + 144 + 112 + 16]
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert nbytes == offsets[-1] + 32 * 32 * 4
    weights = make_weights(MIXED, seed=3)
    buffer = torch.zeros(nbytes, dtype=torch.uint8)
    for (_, tensor), offset in zip(weights, offsets, strict=True):
        data = tensor.contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + data.numel()] = data
    assert_same(unpack(buffer, metas, [0, 1, 2, 3, 4]), weights)


# ---------------------------------------------------------------------------- whole transfers


def test_two_engines_get_every_weight_of_several_dtypes_bit_for_bit():
    backend = make_backend()
    backend.set_weights(MIXED, seed=1)
    engines = [Recorder(), Recorder()]
    sender, receivers = transfer(backend, engines)
    expected = make_weights(MIXED, seed=1)
    nbytes = sum(bucket_layout(backend.weight_metadata(), [i])[1] for i in range(len(MIXED)))
    assert sender.result() == nbytes
    assert [r.result() for r in receivers] == [nbytes, nbytes]
    for engine in engines:
        assert_same(engine.received(), expected)
        assert len(engine.buckets) == 1


def test_many_buckets_and_a_weight_larger_than_a_bucket_arrive_as_the_backend_cuts_them():
    spec = [(f"w{i}", (300, 256), "bfloat16") for i in range(12)]  # 150 KiB each
    spec.insert(5, ("big", (600, 1024), "float32"))  # 2.3 MiB, over the 1 MiB bucket
    backend = make_backend()
    backend.set_weights(spec, seed=2)
    engines = [Recorder(), Recorder()]
    sender, receivers = transfer(backend, engines)
    sender.result()
    for receiver in receivers:
        receiver.result()
    cut = [[name for name, _ in bucket] for bucket in backend.weight_buckets(MIB)]
    assert len(cut) >= 4 and ["big"] in cut
    for engine in engines:
        assert [[name for name, _ in bucket] for bucket in engine.buckets] == cut
        assert_same(engine.received(), make_weights(spec, seed=2))


class Keeper:
    """An engine that keeps the very tensors it is given, no copy."""

    def __init__(self) -> None:
        self.weights: list[tuple[str, torch.Tensor]] = []

    async def load_weights(self, bucket):
        self.weights.extend(bucket)


def test_receive_buffers_are_reused_only_when_the_engine_kept_nothing_of_them(monkeypatch):
    allocated: list[int] = []
    original = collective._Buffer.__init__

    def counting(self, nbytes, device):
        allocated.append(nbytes)
        original(self, nbytes, device)

    monkeypatch.setattr(collective._Buffer, "__init__", counting)
    spec = [(f"w{i}", (512, 1024), "bfloat16") for i in range(10)]  # a 1 MiB bucket each
    backend = make_backend()
    backend.set_weights(spec, seed=5)
    for engine in (Recorder(), Keeper()):
        allocated.clear()
        sender, (receiver,) = transfer(backend, [engine])
        sender.result()
        receiver.result()
        received = engine.received() if isinstance(engine, Recorder) else engine.weights
        assert_same(received, make_weights(spec, seed=5))
        if isinstance(engine, Recorder):
            # two buffers take turns (another when gloo held one a moment too long)
            assert len(allocated) <= 4
        else:
            assert len(allocated) == 10


def test_an_engine_that_never_joins_ends_the_push_after_the_timeout():
    backend = make_backend()
    backend.set_weights(MIXED, seed=1)
    engines = [Recorder(), Recorder()]
    sender, receivers = transfer(
        backend, engines, transport=make_transport(timeout_s=1.5), joining=[1]
    )
    with pytest.raises(PluginError) as info:
        sender.result()
    assert str(info.value) == (
        "1 of 2 engine workers (group ranks 2) did not join the weight transfer within 1.5 s; "
        "see their logs (are they alive, can they reach this machine?), raise "
        f"{TIMEOUT_KEY}, or use rollout.weight_transport=object_store"
    )
    # the engine that joined gives up too, with its own line
    with pytest.raises(PluginError, match=r"^engine worker \(group rank 1\) failed to receive"):
        receivers[0].result()


def test_a_sender_told_that_an_engine_failed_stops_waiting_at_once():
    backend = make_backend()
    backend.set_weights(MIXED, seed=1)
    transport = make_transport(timeout_s=60)
    session = uuid.uuid4().hex
    host, port = transport.send(backend, Listen(session, 60))
    weights = tuple(backend.weight_metadata())
    send = Send(session, 2, weights, MIB, 60)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sender = pool.submit(transport.send, backend, send)
        time.sleep(0.2)
        abandon(host, port, "EngineDied: the actor died")
        with pytest.raises(PluginError) as info:
            sender.result(timeout=30)
    # the abandoning engine's reason: the sender stopped waiting when told, not at a timeout
    assert str(info.value) == (
        "an engine worker failed to join the weight transfer: EngineDied: the actor died"
    )


def test_an_engine_that_cannot_load_a_bucket_still_receives_to_the_end_and_says_why():
    spec = [(f"w{i}", (300, 1024), "float32") for i in range(4)]  # a bucket each
    backend = make_backend()
    backend.set_weights(spec, seed=4)
    engines = [Recorder(fail_on=1), Recorder()]
    sender, receivers = transfer(backend, engines)
    sender.result()  # the sender finished: nobody stopped reading
    with pytest.raises(PluginError) as info:
        receivers[0].result()
    assert str(info.value) == (
        "engine worker (group rank 1) could not load the weights it received: "
        "ValueError: this engine has no room for them"
    )
    assert len(engines[0].buckets) == 2  # nothing loaded after the failure
    assert_same(engines[1].received(), make_weights(spec, seed=4))


def test_a_weight_unlike_its_announcement_stops_sender_and_engines_with_one_line():
    backend = make_backend()
    backend.set_weights(MIXED, seed=1, misannounce=True)
    engines = [Recorder(), Recorder()]
    sender, receivers = transfer(backend, engines)
    with pytest.raises(PluginError) as info:
        sender.result()
    assert str(info.value) == (
        "trainer rank 0 yielded embed as bfloat16 (64, 32), announced as bfloat16 (64, 32, 1); "
        "the backend's weight_metadata and named_weights must agree"
    )
    for receiver in receivers:
        with pytest.raises(PluginError) as info:
            receiver.result()
        assert str(info.value) == (
            "the trainer stopped sending weights part-way (its error says why)"
        )


def test_weights_missing_from_rank_0_stop_the_push_and_name_the_limit():
    backend = make_backend()
    backend.set_weights(MIXED, seed=1, senders=())
    sender, receivers = transfer(backend, [Recorder()])
    with pytest.raises(PluginError) as info:
        sender.result()
    assert str(info.value) == (
        "trainer rank 0 yielded 0 of the 5 announced weights (missing embed, norm, layer.0, "
        "...); the collective transport sends from rank 0 only: use "
        "rollout.weight_transport=object_store for a backend whose weights come from several "
        "ranks"
    )
    with pytest.raises(PluginError, match="stopped sending weights part-way"):
        receivers[0].result()


def test_another_rank_that_yields_weights_is_refused_after_running_its_buckets():
    backend = make_backend(rank=1, world_size=2)
    backend.set_weights(MIXED, seed=1, senders=(0, 1))
    weights = tuple(backend.weight_metadata())
    transport = make_transport()
    assert transport.send(backend, Listen("s", 5)) is None  # only rank 0 hosts the store
    with pytest.raises(PluginError) as info:
        transport.send(backend, Send("s", 2, weights, MIB, 5))
    assert str(info.value) == (
        "trainer rank 1 yielded weights (embed, ...), but the collective transport sends from "
        "trainer rank 0 only; use rollout.weight_transport=object_store for a backend whose "
        "weights come from several ranks"
    )
    backend.set_weights(MIXED, seed=1, senders=(0,))
    assert transport.send(backend, Send("s", 2, weights, MIB, 5)) is None


# ---------------------------------------------------------------------------- where it applies


class Group:
    def __init__(self, in_process: bool, recipe=None, device_name: str = "cpu") -> None:
        self.in_process = in_process
        self.recipe = recipe or Recipe()
        self.device_name = device_name


def test_it_needs_workers_of_their_own_one_sending_rank_and_devices_of_their_own():
    assert CollectiveTransport.unusable_reason(Group(False), Group(False)) is None
    assert CollectiveTransport.unusable_reason(Group(True), Group(True)) == (
        "it needs the trainer and the engines in processes of their own (cluster: ray)"
    )
    # a backend whose config has pipeline stages (megatron's actor section)
    recipe = SimpleNamespace(actor=SimpleNamespace(pipeline_model_parallel_size=4))
    assert CollectiveTransport.unusable_reason(Group(False, recipe), Group(False)) == (
        "the trainer's weights come from each of its 4 pipeline stages, and this transport "
        "sends from one rank (trainer rank 0)"
    )
    colocated = Recipe(rollout=RolloutConfig(colocate=True))
    assert CollectiveTransport.unusable_reason(Group(False), Group(False, colocated)) is None
    assert CollectiveTransport.unusable_reason(Group(False), Group(False, colocated, "cuda")) == (
        "the engines share the trainer's cuda devices (rollout.colocate: true), and a collective "
        "group cannot hold two ranks on one device; set rollout.colocate=false or use another "
        "transport"
    )
    separate = Recipe(rollout=RolloutConfig(colocate=False))
    assert CollectiveTransport.unusable_reason(Group(False), Group(False, separate, "cuda")) is None


def test_the_timeout_comes_from_the_recipe():
    config = RolloutConfig(update_weights_timeout_s=42)
    transport = CollectiveTransport(config, part_context(device=CpuDevice()))
    assert transport.timeout_s == 42
