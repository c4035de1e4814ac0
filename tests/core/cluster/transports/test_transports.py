"""The built-in weight transports: registration, how ``auto`` chooses, and the order of a push
(announce, every bucket, finish) with at most a few buckets loading at once."""

from __future__ import annotations

import concurrent.futures
from typing import ClassVar

import pytest
import torch

import plugrl
from plugrl.cluster.transports.buckets import (
    BUCKETS_IN_FLIGHT,
    LocalTransport,
    ObjectStoreTransport,
)
from plugrl.compose.run_parts import choose_transport
from plugrl.errors import RecipeError
from plugrl.parts.rollout import RolloutConfig, WeightMeta
from plugrl.parts.transport import WeightTransport
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import Recipe
from plugrl.testing import part_context
from plugrl_cpu.device import CpuDevice


class Trainer:
    """Stands for a worker group: three weights in two buckets."""

    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process
        self.weights = [("a", torch.ones(4)), ("b", torch.ones(2)), ("c", torch.ones(8))]

    def weight_metadata(self):
        return [WeightMeta(name, tuple(t.shape), "float32") for name, t in self.weights]

    def stream_weight_buckets(self, bucket_bytes):
        yield self.weights[:2]
        yield self.weights[2:]


class Engines:
    """Stands for an engine group, recording the calls and the loads not yet finished."""

    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process
        self.calls: list = []
        self.pending: list[concurrent.futures.Future] = []
        self.most_pending = 0

    def begin_weight_update(self, version, weights, indices=None):
        self.calls.append(("begin", version, [w.name for w in weights], indices))

    def load_weights_async(self, bucket, indices=None):
        self.calls.append(("load", [name for name, _ in bucket], indices))
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pending.append(future)
        self.most_pending = max(self.most_pending, sum(not f.done() for f in self.pending))
        # loads finish when the transport waits for them
        future.add_done_callback(lambda _: None)
        original = future.result

        def result(timeout=None):
            if not future.done():
                future.set_result(None)
            return original(timeout)

        future.result = result  # type: ignore[method-assign]
        return future

    def wait_weights(self, future, method):
        return future.result()

    def finish_weight_update(self, indices=None):
        assert all(f.done() for f in self.pending), "finish before every bucket loaded"
        self.calls.append(("finish", indices))


def test_a_push_announces_loads_every_bucket_and_finishes():
    transport = LocalTransport(RolloutConfig(), part_context())
    engines = Engines(in_process=True)
    metrics = transport.push(Trainer(in_process=True), engines, version=7, engine_indices=[0])
    assert engines.calls == [
        ("begin", 7, ["a", "b", "c"], [0]),
        ("load", ["a", "b"], [0]),
        ("load", ["c"], [0]),
        ("finish", [0]),
    ]
    assert engines.most_pending <= BUCKETS_IN_FLIGHT + 1
    assert metrics["perf/weight_sync_megabytes"] == pytest.approx(14 * 4 / 2**20)
    assert metrics["perf/weight_sync_megabytes_per_s"] > 0


def test_each_transport_says_where_it_cannot_go():
    here, there = (Trainer(True), Engines(True)), (Trainer(False), Engines(False))
    assert LocalTransport.unusable_reason(*here) is None
    assert LocalTransport.unusable_reason(*there) == (
        "it needs the trainer and the engine in one process (cluster: local)"
    )
    assert ObjectStoreTransport.unusable_reason(*there) is None
    assert ObjectStoreTransport.unusable_reason(*here) == (
        "it needs the trainer and the engines in Ray actors (cluster: ray)"
    )


@pytest.fixture
def plugins():
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    return manager


def recipe(transport: str = "auto") -> Recipe:
    return Recipe(rollout=RolloutConfig(weight_transport=transport))


def test_auto_takes_the_local_transport_in_one_process_and_the_object_store_on_ray(plugins):
    local = choose_transport(
        recipe(), Trainer(True), Engines(True), device=CpuDevice(), plugins=plugins
    )
    remote = choose_transport(
        recipe(), Trainer(False), Engines(False), device=CpuDevice(), plugins=plugins
    )
    assert type(local) is LocalTransport and type(remote) is ObjectStoreTransport
    assert local.bucket_bytes == 512 * 2**20


def test_a_named_transport_that_cannot_connect_the_parts_stops_the_run(plugins):
    with pytest.raises(RecipeError) as info:
        choose_transport(
            recipe("local"), Trainer(False), Engines(False), device=CpuDevice(), plugins=plugins
        )
    assert str(info.value) == (
        "rollout.weight_transport: transport 'local' cannot be used here: it needs the trainer "
        "and the engine in one process (cluster: local)"
    )


class Pigeon(WeightTransport):
    """A third-party transport: carries nothing, but says it did."""

    carried: ClassVar[list[int]] = []

    def push(self, trainer, engines, version, *, engine_indices=None):
        self.carried.append(version)
        return {}


class PigeonPlugin:
    @plugrl.hookimpl
    def register_weight_transports(self, register):
        register("pigeon", Pigeon)


def test_a_plugin_can_bring_its_own_transport(plugins):
    plugins.register(PigeonPlugin(), name="pigeon-plugin")
    chosen = choose_transport(
        recipe("pigeon"), Trainer(False), Engines(False), device=CpuDevice(), plugins=plugins
    )
    assert isinstance(chosen, Pigeon)
    chosen.push(Trainer(False), Engines(False), 3)
    assert Pigeon.carried == [3]
