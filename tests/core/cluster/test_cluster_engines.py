"""Engine workers and groups: one engine in this process, engines as Ray actors, restarts of
dead engines, and weights through the object store, with an engine that needs no model."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from plugrl.cluster.engines import LocalEngineGroup, RayEngineGroup, make_engine_group
from plugrl.cluster.groups import make_worker_group
from plugrl.data.batch import Batch
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.backend import ActorConfig
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import (
    Capability,
    GenerationRequest,
    RolloutConfig,
    SamplingParams,
    WeightMeta,
    check_capabilities,
    derive_seed,
)
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, Recipe
from tests.core.cluster import cluster_fake_backend, cluster_fake_engine
from tests.support import SHARED_RAY_CPUS, shared_ray_for_module, wait_until

MAX = 97


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_engine, name="cluster_fake_engine")
    manager.register(cluster_fake_backend, name="cluster_fake_backend")
    return manager


def local_recipe(engine: str = "counting", **rollout) -> Recipe:
    return Recipe(rollout=RolloutConfig(engine=engine, **rollout))


@pytest.fixture
def local_group(plugins):
    group = LocalEngineGroup(local_recipe(), device_name="cpu", plugins=plugins)
    yield group
    group.close()


def sample_tokens(request_seed: int, sample: int, length: int, offset: int = 0) -> list[int]:
    """What the counting engine emits for one sample of a seeded request."""
    seed = derive_seed(request_seed, sample)
    return [offset + (seed + i) % MAX for i in range(length)]


def batch_tokens(batch_seed: int, prompt: int, sample: int, length: int, offset: int = 0):
    """... for a sample of a batch call, whose requests get seeds derived from the batch's."""
    return sample_tokens(derive_seed(batch_seed, prompt), sample, length, offset)


def request(request_id: str, max_tokens: int, seed: int = 3, n: int = 1) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        prompt_ids=[1, 2, 3],
        params=SamplingParams(n=n, max_tokens=max_tokens, seed=seed),
    )


def push(group, version: int, value: float, indices=None) -> None:
    weight = torch.full((2,), value / 2)
    group.begin_weight_update(version, [WeightMeta("w", (2,), "float32")], indices)
    group.load_weights([("w", weight)], indices)
    group.finish_weight_update(indices)


def generating(group: LocalEngineGroup, request_id: str) -> None:
    """Wait until the group's engine has generated a token of ``request_id``."""
    wait_until(
        lambda: group.engine.tokens_so_far.get(request_id, 0) > 0,
        f"the engine to generate a token of request {request_id!r}",
    )


# ---------------------------------------------------------------------------- one engine, here


def test_the_engine_is_prepared_then_built_and_its_patches_are_logged(plugins, caplog):
    cluster_fake_engine.PREPARED.clear()
    with caplog.at_level(logging.INFO, logger="plugrl.cluster"):
        group = LocalEngineGroup(local_recipe(), device_name="cpu", plugins=plugins)
    try:
        assert group.engine.prepared_before_init == [("cpu", "counting")]
        assert group.capabilities == cluster_fake_engine.CountingEngine.capabilities
        assert group.in_process and group.num_engines == 1
    finally:
        group.close()
    assert "prepare_rollout(cpu, counting) by cluster_fake_engine: counting patch for cpu" in (
        caplog.messages
    )


def test_an_engine_whose_framework_was_imported_first_is_refused(plugins):
    with pytest.raises(PluginError) as info:
        LocalEngineGroup(local_recipe("counting_guarded"), device_name="cpu", plugins=plugins)
    assert str(info.value) == (
        "json was imported in this process before prepare_rollout ran for cpu + "
        "counting_guarded, so patches that must come first (MindSpeed on npu, for one) would "
        "not apply; do not import json before the run builds its parts (check the reward "
        "function's and other plugins' module imports)"
    )


def test_a_batch_comes_back_grouped_by_prompt_and_seeded_per_prompt(local_group):
    completions = local_group.generate(
        [[1], [2, 3], [4]], SamplingParams(n=2, max_tokens=4, seed=9)
    )
    assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2]
    assert [c.sample_index for c in completions] == [0, 1] * 3
    for c in completions:
        assert c.token_ids == batch_tokens(9, c.prompt_index, c.sample_index, 4)
        assert c.finish_reason == "length" and c.token_versions == [0] * 4


def test_each_prompts_completions_are_handed_over_as_its_request_ends(local_group):
    params = SamplingParams(n=2, max_tokens=4, seed=9)
    handed = []

    def on_finished(prompt_index, completions):
        assert not returned  # called while generate runs, in the calling thread
        handed.append((prompt_index, sorted(c.token_ids for c in completions)))

    returned = []
    returned.extend(local_group.generate([[1], [2, 3], [4]], params, on_finished=on_finished))
    assert sorted(index for index, _ in handed) == [0, 1, 2]
    for index, tokens in handed:
        assert tokens == sorted(batch_tokens(9, index, sample, 4) for sample in range(2))
    plain = local_group.generate([[1], [2, 3], [4]], params)
    assert [(c.prompt_index, c.token_ids) for c in returned] == [
        (c.prompt_index, c.token_ids) for c in plain
    ]


def test_an_engine_gets_every_request_of_a_batch_before_it_decodes(local_group, monkeypatch):
    """An engine that starts decoding at its first request (as the hf engine does) decodes the
    whole batch from its first step: the batches it decodes, whose shapes move its numbers in
    the last bits, do not depend on the threads' timing."""
    import asyncio

    engine = local_group.engine
    arrived: list[str] = []
    decoding_with: list[int] = []
    generate_request = engine.generate_request

    async def first_arrival_starts_decoding(request):
        if not arrived:
            asyncio.get_running_loop().call_soon(lambda: decoding_with.append(len(arrived)))
        arrived.append(request.request_id)
        return await generate_request(request)

    monkeypatch.setattr(engine, "generate_request", first_arrival_starts_decoding)
    for _ in range(3):
        arrived.clear()
        local_group.generate([[1], [2], [3], [4], [5], [6]], SamplingParams(n=1, max_tokens=2))
        assert [r.rsplit("-", 1)[-1] for r in arrived] == [str(i) for i in range(6)]
    assert decoding_with == [6, 6, 6]


def test_many_requests_are_in_flight_at_once(local_group):
    # paused, the engine holds every request it was given: a group that sent them one after
    # another would never have all 20 in flight at once
    local_group.pause("keep")
    futures = [local_group.submit(request(f"r{i}", 50)) for i in range(20)]
    wait_until(
        lambda: local_group.engine.in_flight == 20, "the engine to hold all 20 requests at once"
    )
    local_group.resume()
    results = [future.result(timeout=60) for future in futures]
    assert [r[0].request_id for r in results] == [f"r{i}" for i in range(20)]
    assert all(len(r[0].token_ids) == 50 for r in results)


def test_abort_ends_the_named_requests_with_the_tokens_they_have(local_group):
    long = local_group.submit(request("long", 100_000))
    short = local_group.submit(request("short", 5))
    generating(local_group, "long")
    local_group.abort(["long"])
    (aborted,) = long.result(timeout=30)
    (finished,) = short.result(timeout=30)
    assert aborted.finish_reason == "aborted" and 0 < len(aborted.token_ids) < 100_000
    assert aborted.token_ids == sample_tokens(3, 0, len(aborted.token_ids))
    assert finished.finish_reason == "length" and len(finished.token_ids) == 5


def test_paused_requests_continue_with_new_weights_and_say_so(local_group):
    future = local_group.submit(request("partial", 400))
    generating(local_group, "partial")
    local_group.pause("keep")
    made = local_group.engine.tokens_so_far["partial"]
    assert made < 400, "the request ended before the pause reached the engine"
    push(local_group, version=1, value=1000.0)
    local_group.resume()
    (completion,) = future.result(timeout=30)
    switch = completion.token_versions.index(1)
    assert 0 < switch < 400
    assert completion.token_versions == [0] * switch + [1] * (400 - switch)
    tokens = sample_tokens(3, 0, 400)
    assert completion.token_ids == tokens[:switch] + [t + 1000 for t in tokens[switch:]]
    assert local_group.weight_version == 1


def test_pause_abort_ends_requests_in_flight(local_group):
    future = local_group.submit(request("cut", 100_000))
    generating(local_group, "cut")
    local_group.pause("abort")
    (completion,) = future.result(timeout=30)
    local_group.resume()
    assert completion.finish_reason == "aborted"


def test_a_scheduler_needing_what_an_engine_lacks_stops_at_start_up():
    with pytest.raises(RecipeError) as info:
        check_capabilities(
            "counting_plain",
            cluster_fake_engine.PlainEngine,
            {Capability.PAUSE_KEEP: "scheduler.partial_rollout=true"},
        )
    assert str(info.value) == (
        "rollout.engine: rollout engine 'counting_plain' cannot pause requests in flight and "
        "continue them after a weight update, which scheduler.partial_rollout=true needs: its "
        "class PlainEngine does not declare Capability.PAUSE_KEEP in its capabilities; set "
        "rollout.engine to an engine that declares Capability.PAUSE_KEEP, or change what needs "
        "it"
    )
    check_capabilities("counting", cluster_fake_engine.CountingEngine, {Capability.ABORT: "x"})


# ---------------------------------------------------------------------------- engines on Ray


@pytest.fixture(scope="module")
def ray_session():
    with shared_ray_for_module() as ray:
        yield ray


def ray_recipe(**rollout) -> Recipe:
    rollout = {"engine": "counting", "colocate": False, "n_gpus_per_node": 2, **rollout}
    return Recipe(
        actor=ActorConfig(backend="fake_dp", ppo_mini_batch_size=4),
        rollout=RolloutConfig(**rollout),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
    )


@pytest.mark.slow
def test_ray_engines_share_the_requests_and_sample_like_one_local_engine(ray_session, plugins):
    engines = make_engine_group(ray_recipe(), device_name="cpu", plugins=plugins)
    local = LocalEngineGroup(local_recipe(), device_name="cpu", plugins=plugins)
    try:
        assert isinstance(engines, RayEngineGroup) and engines.num_engines == 2
        assert len(set(engines.engine_pids())) == 2
        assert os.getpid() not in engines.engine_pids()
        prompts = [[i] for i in range(8)]
        params = SamplingParams(n=2, max_tokens=20, seed=4)
        remote = engines.generate(prompts, params)
        assert [c.token_ids for c in remote] == [
            c.token_ids for c in local.generate(prompts, params)
        ]
    finally:
        engines.close()
        local.close()


@pytest.mark.slow
def test_a_killed_engine_is_restarted_and_every_request_answered_once(ray_session, plugins):
    engines = make_engine_group(ray_recipe(), device_name="cpu", plugins=plugins)
    resynced: list[list[int]] = []

    def resync(indices):
        resynced.append(indices)
        push(engines, version=1, value=500.0, indices=indices)

    engines.on_restart = resync
    try:
        push(engines, version=1, value=500.0)
        old_pids = engines.engine_pids()
        futures = [engines.submit(request(f"r{i}", 200, seed=i)) for i in range(8)]
        wait_until(lambda: engines.in_flight() == 8, "the 8 requests to reach the engines")
        os.kill(old_pids[0], signal.SIGKILL)
        results = [future.result(timeout=120) for future in futures]
        assert engines.restarts == 1 and resynced == [[0]]
        new_pids = engines.engine_pids()
        assert new_pids[0] != old_pids[0] and new_pids[1] == old_pids[1]
        for i, (completion,) in enumerate(results):
            assert completion.request_id == f"r{i}"
            assert completion.finish_reason == "length"
            # whether it ran on the survivor or started again on the restarted engine, every
            # token comes from the weights of version 1
            assert completion.token_versions == [1] * 200
            assert completion.token_ids == sample_tokens(i, 0, 200, offset=500)
    finally:
        engines.close()


@pytest.mark.slow
def test_an_engine_that_keeps_dying_stops_the_run_with_the_limit(ray_session, plugins):
    engines = make_engine_group(
        ray_recipe(max_engine_restarts=0), device_name="cpu", plugins=plugins
    )
    try:
        future = engines.submit(request("doomed", 100_000), engine_index=0)
        wait_until(lambda: engines.in_flight() == 1, "the request to reach engine 0")
        os.kill(engines.engine_pids()[0], signal.SIGKILL)
        with pytest.raises(PluginError) as info:
            future.result(timeout=60)
        assert str(info.value) == (
            "engine worker 0 died after 0 restarts already (rollout.max_engine_restarts=0); "
            "see the worker's log for why"
        )
    finally:
        engines.close()


@pytest.mark.slow
def test_weights_reach_ray_engines_through_the_object_store(ray_session, plugins):
    import ray

    from plugrl.cluster.transports.buckets import ObjectStoreTransport

    recipe = ray_recipe()
    trainer = make_worker_group(recipe, "actor", device_name="cpu", plugins=plugins, world_size=2)
    engines = make_engine_group(recipe, device_name="cpu", plugins=plugins)
    try:
        trainer.setup(1)
        trainer.update_policy(Batch({"row_id": torch.arange(4)}), cluster_fake_backend.SumRowIds())
        # the driver sees references to the buckets, never the tensors
        refs = list(trainer.stream_weight_buckets(1 << 20))
        assert refs and all(isinstance(ref, ray.ObjectRef) for ref in refs)
        transport = ObjectStoreTransport(recipe.rollout, PartContext(recipe=recipe))
        assert transport.unusable_reason(trainer, engines) is None
        metrics = transport.push(trainer, engines, version=5)
        assert metrics["perf/weight_sync_megabytes"] == pytest.approx(4 / 2**20)
        assert engines.weight_version == 5
        (completion,) = engines.generate([[1]], SamplingParams(max_tokens=3, seed=2))
        # the fake backend's weight counts its updates: one, so every token is offset by 1
        assert completion.token_ids == batch_tokens(2, 0, 0, 3, offset=1)
        assert completion.token_versions == [5, 5, 5]
    finally:
        engines.close()
        trainer.close()


@pytest.mark.slow
def test_colocated_engines_sit_on_the_trainers_devices(ray_session, plugins):
    from plugrl.cluster.groups import make_placement

    recipe = ray_recipe(colocate=True)
    placement = make_placement(recipe, ["actor", "rollout"], device_name="cpu", plugins=plugins)
    assert placement is not None
    trainer = make_worker_group(
        recipe, "actor", device_name="cpu", plugins=plugins, placement=placement
    )
    trainer.setup(1)
    engines = make_engine_group(
        recipe, device_name="cpu", plugins=plugins, trainer_placement=placement
    )
    try:
        # one engine per trainer device, on the same bundles, each a share of it
        assert engines.num_engines == placement.world_size == 1
        assert engines.placement is placement and not engines.owns_placement
        report = trainer.execute_all("report")[0]
        assert report["ray"]["placement_group"] == placement.placement_group.id.hex()
        engines.sleep()
        engines.wake_up(["weights"])
        (completion,) = engines.generate([[5]], SamplingParams(max_tokens=2, seed=1))
        assert completion.token_ids == batch_tokens(1, 0, 0, 2)
    finally:
        engines.close()
        trainer.close()
        placement.close()
