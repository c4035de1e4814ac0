"""Two fsdp2 ranks as Ray actors push their weights to two ``counting`` engine actors through
the ``collective`` transport (gloo): the engines get exactly ``named_weights()``. The ranks
also describe the weights without gathering them."""

import pytest
import torch

from plugrl.cluster.engines import make_engine_group
from plugrl.cluster.ray_group import RayWorkerGroup
from plugrl.cluster.transports.collective import CollectiveTransport
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import RolloutConfig, WeightMeta
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, Recipe
from tests.plugins.backends.fsdp2.fsdp2_testing import make_recipe
from tests.support import SHARED_RAY_CPUS, shared_ray_for_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_session():
    with shared_ray_for_module() as ray:
        yield ray


@pytest.fixture(scope="module")
def parts(ray_session, tiny_model):
    from tests.core.cluster import cluster_fake_engine

    plugins = PluginManager()
    plugins.load_entry_points()
    plugins.register(cluster_fake_engine, name="cluster_fake_engine")
    trainer = RayWorkerGroup(
        make_recipe(tiny_model, cluster="ray", dtype="bfloat16"),
        "actor",
        world_size=2,
        device_name="cpu",
        plugins=plugins,
    )
    # the engines need no model folder: the counting engine samples from the weights' sum
    engine_recipe = Recipe(
        rollout=RolloutConfig(engine="counting", colocate=False, n_gpus_per_node=2),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
    )
    engines = make_engine_group(engine_recipe, device_name="cpu", plugins=plugins)
    trainer.setup(10)
    yield trainer, engines, engine_recipe
    engines.close()
    trainer.close()


def test_the_engines_get_exactly_what_named_weights_yields(parts):
    import ray

    trainer, engines, recipe = parts
    transport = CollectiveTransport(recipe.rollout, PartContext(recipe=recipe))
    assert transport.unusable_reason(trainer, engines) is None
    metrics = transport.push(trainer, engines, version=3)
    expected = trainer.named_weights()
    assert {tensor.dtype for _, tensor in expected} == {torch.bfloat16}

    def held(worker):
        return worker.engine.weight_version, list(worker.engine.weights.items())

    for worker in engines.workers:
        version, weights = ray.get(worker.__ray_call__.remote(held))
        assert version == 3
        assert [name for name, _ in weights] == [name for name, _ in expected]
        for (name, got), (_, want) in zip(weights, expected, strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), name
    nbytes = sum(tensor.numel() * tensor.element_size() for _, tensor in expected)
    assert metrics["perf/weight_sync_megabytes"] == pytest.approx(nbytes / 2**20)


def test_each_rank_describes_the_gathered_weights_alone(parts):
    import ray

    trainer, _, _ = parts
    expected = [
        WeightMeta(name, tuple(tensor.shape), "bfloat16")
        for name, tensor in trainer.named_weights()
    ]
    assert trainer.execute_all("weight_metadata") == [expected, expected]
    # rank 1 answers without rank 0 taking part: nothing is gathered (a gather would wait)
    assert ray.get(trainer.workers[1].call.remote("weight_metadata"), timeout=60) == expected
