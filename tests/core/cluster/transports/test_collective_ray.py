"""The ``collective`` transport between Ray actors: a backend of 2 ranks (rank 0 yields the
weights) and 2 ``counting`` engine workers, over gloo. What the engines hold and sample after a
push is compared with what the ``object_store`` transport gives them."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from plugrl.cluster.engines import make_engine_group
from plugrl.cluster.groups import make_worker_group
from plugrl.cluster.transports.buckets import ObjectStoreTransport
from plugrl.cluster.transports.collective import CollectiveTransport
from plugrl.errors import PluginError
from plugrl.parts.backend import ActorConfig
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import RolloutConfig, SamplingParams
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, Recipe
from tests.core.cluster import cluster_fake_engine
from tests.core.cluster.transports import transport_fake_backend
from tests.core.cluster.transports.transport_fake_backend import make_weights
from tests.support import SHARED_RAY_CPUS, shared_ray_for_module

pytestmark = pytest.mark.slow

# bfloat16 and float32 in one push, 1 MiB buckets: many of them, and one weight (2.3 MiB)
# that travels alone
SPEC = [
    ("model.embed_tokens.weight", (512, 256), "bfloat16"),
    *[(f"model.layers.{i}.mlp.weight", (512, 512), "bfloat16") for i in range(8)],
    ("model.layers.0.norm.weight", (256,), "float32"),
    ("lm_head.weight", (600, 1024), "float32"),
    ("model.norm.weight", (256,), "float32"),
]


@pytest.fixture(scope="module")
def ray_session():
    with shared_ray_for_module() as ray:
        yield ray


@pytest.fixture(scope="module")
def recipe():
    return Recipe(
        actor=ActorConfig(backend="fake_weights"),
        rollout=RolloutConfig(
            engine="counting", colocate=False, n_gpus_per_node=2, update_weights_bucket_megabytes=1
        ),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
    )


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_engine, name="cluster_fake_engine")
    manager.register(transport_fake_backend, name="transport_fake_backend")
    return manager


@pytest.fixture(scope="module")
def parts(ray_session, recipe, plugins):
    trainer = make_worker_group(recipe, "actor", device_name="cpu", plugins=plugins, world_size=2)
    engines = make_engine_group(recipe, device_name="cpu", plugins=plugins)
    trainer.setup(1)
    yield trainer, engines
    engines.close()
    trainer.close()


def transports(recipe):
    context = PartContext(recipe=recipe)
    return CollectiveTransport(recipe.rollout, context), ObjectStoreTransport(
        recipe.rollout, context
    )


def engine_state(engines, index: int) -> tuple[int, dict[str, torch.Tensor]]:
    """The version and the weights engine worker ``index`` holds."""
    import ray

    def state(worker):
        return worker.engine.weight_version, dict(worker.engine.weights)

    return ray.get(engines.workers[index].__ray_call__.remote(state))


def sample(engines) -> list[list[int]]:
    completions = engines.generate([[1], [2], [3], [4]], SamplingParams(max_tokens=4, seed=5))
    return [c.token_ids for c in completions]


def assert_holds(engines, index: int, version: int, seed: int) -> None:
    held_version, held = engine_state(engines, index)
    assert held_version == version
    expected = make_weights(SPEC, seed)
    assert list(held) == [name for name, _ in expected]
    for name, tensor in expected:
        assert held[name].dtype == tensor.dtype and torch.equal(held[name], tensor), name


def test_collective_gives_the_engines_what_the_object_store_gives_them(parts, recipe):
    trainer, engines = parts
    collective, object_store = transports(recipe)
    assert collective.unusable_reason(trainer, engines) is None
    # the push cuts the weights into many buckets, one of them a lone weight over the limit
    buckets = [
        [name for name, _ in bucket]
        for bucket in transport_fake_backend.WeightsBackend.weight_buckets(
            _Weights(make_weights(SPEC, 0)), collective.bucket_bytes
        )
    ]
    assert len(buckets) >= 5 and ["lm_head.weight"] in buckets

    trainer.execute_all("set_weights", SPEC, 0)
    object_store.push(trainer, engines, version=1)
    before = sample(engines)
    trainer.execute_all("set_weights", SPEC, 1)
    object_store.push(trainer, engines, version=2)
    through_object_store = sample(engines)
    assert through_object_store != before

    trainer.execute_all("set_weights", SPEC, 0)
    collective.push(trainer, engines, version=3)
    assert sample(engines) == before
    trainer.execute_all("set_weights", SPEC, 1)
    metrics = collective.push(trainer, engines, version=4)
    assert sample(engines) == through_object_store
    assert engines.weight_version == 4
    for index in (0, 1):
        assert_holds(engines, index, version=4, seed=1)
    nbytes = sum(tensor.numel() * tensor.element_size() for _, tensor in make_weights(SPEC, 1))
    assert metrics["perf/weight_sync_megabytes"] == pytest.approx(nbytes / 2**20)
    assert metrics["perf/weight_sync_megabytes_per_s"] > 0


def test_a_push_to_some_engines_leaves_the_others_as_they_were(parts, recipe):
    trainer, engines = parts
    collective, _ = transports(recipe)
    trainer.execute_all("set_weights", SPEC, 7)
    collective.push(trainer, engines, version=5)
    trainer.execute_all("set_weights", SPEC, 8)
    collective.push(trainer, engines, version=6, engine_indices=[1])
    assert_holds(engines, 1, version=6, seed=8)
    assert_holds(engines, 0, version=5, seed=7)
    # the group's version is that of every engine: the last full push
    assert engines.weight_version == 5


def test_a_second_sending_rank_stops_the_push_with_the_transport_to_use(parts, recipe):
    trainer, engines = parts
    collective, _ = transports(recipe)
    trainer.execute_all("set_weights", SPEC, 1, (0, 1))
    try:
        with pytest.raises(PluginError) as info:
            collective.push(trainer, engines, version=7)
    finally:
        trainer.execute_all("set_weights", SPEC, 1)
    assert str(info.value) == (
        "trainer rank 1 yielded weights (model.embed_tokens.weight, ...), but the collective "
        "transport sends from trainer rank 0 only; use rollout.weight_transport=object_store "
        "for a backend whose weights come from several ranks"
    )
    # the engines are fine: the next push goes through
    collective.push(trainer, engines, version=8)
    assert_holds(engines, 0, version=8, seed=1)


class FailingEngines:
    """Stands for an engine group whose workers fail before joining (died, cannot connect)."""

    in_process = False
    num_engines = 2

    def begin_weight_update(self, version, weights, indices=None):
        pass

    def transport_receive(self, name, sessions, indices=None):
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_exception(PluginError("engine worker 0 cannot reach the trainer"))
        return future


def test_engines_that_fail_before_joining_end_the_push_at_once_with_their_error(parts, recipe):
    trainer, _ = parts
    collective, _ = transports(recipe)
    collective.timeout_s = 120
    with pytest.raises(PluginError) as info:
        collective.push(trainer, FailingEngines(), version=9)
    # the engines' error, not the 120 s timeout's message: the push did not wait it out
    assert str(info.value) == "engine worker 0 cannot reach the trainer"


class _Weights:
    """Just enough of a backend for the base class's bucketing."""

    def __init__(self, weights):
        self.weights = weights

    def named_weights(self):
        return iter(self.weights)
