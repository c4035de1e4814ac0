"""Colocated engines of several devices on Ray: engine e of tensor-parallel size tp on the
bundles of trainer ranks e*tp .. (e+1)*tp - 1, seeing their devices, on a local Ray whose
four GPUs are logical (Ray hands out their ids; nothing computes on a GPU)."""

from __future__ import annotations

import json

import pytest

from plugrl.cluster.engines import RayEngineGroup, engine_spans, make_engine_group, span_env
from plugrl.cluster.groups import make_placement
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import build_recipe
from tests.core.cluster import cluster_fake_gpu
from tests.support import local_ray

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpu_ray():
    # a cluster of its own: the shared one has no GPUs
    with local_ray(num_cpus=4, num_gpus=4) as ray:
        yield ray


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_gpu, name="cluster_fake_gpu")
    return manager


def recipe(plugins, trace, *, tp=2, ranks=4):
    return build_recipe(
        {
            "device": "fakegpu",
            "cluster": {"mode": "ray", "num_cpus": 4},
            "trainer": {"n_gpus_per_node": ranks},
            "actor": {"backend": "sim", "ppo_mini_batch_size": 4},
            "rollout": {
                "engine": "sim",
                "tensor_model_parallel_size": tp,
                "sim_trace_file": str(trace),
            },
        },
        plugins,
    )


def started(trace) -> dict[int, dict]:
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    return {line["pid"]: line for line in lines if line["event"] == "start"}


def test_two_engines_of_two_devices_sit_on_the_four_trainer_devices(gpu_ray, plugins, tmp_path):
    trace = tmp_path / "trace.jsonl"
    run = recipe(plugins, trace)
    placement = make_placement(run, ["actor", "rollout"], device_name="fakegpu", plugins=plugins)
    assert placement is not None
    try:
        # the devices of each trainer bundle, before any actor holds a share of it
        bundles = placement.bundle_devices("actor", range(4))
        engines = make_engine_group(
            run, device_name="fakegpu", plugins=plugins, trainer_placement=placement
        )
        try:
            assert isinstance(engines, RayEngineGroup)
            assert engines.num_engines == 2 and engines.spans == [[0, 1], [2, 3]]
            assert engines.placement is placement and not engines.owns_placement
            starts = started(trace)
            pids = engines.engine_pids()
            assert sorted(starts) == sorted(pids)
            for pid, span in zip(pids, engines.spans, strict=True):
                # engine e sees exactly the devices of its trainer ranks, its own bundle's first
                expected = [device for b in span for device in bundles[b][1]]
                assert starts[pid]["visible"] == ",".join(expected)
                assert starts[pid]["devices"] == 2
            seen = [d for pid in pids for d in starts[pid]["visible"].split(",")]
            assert sorted(seen) == sorted({d for _, ids in bundles for d in ids})
            assert len(seen) == 4
        finally:
            engines.close()
    finally:
        placement.close()


def test_engines_take_consecutive_bundles():
    assert engine_spans(4, 2) == [[0, 1], [2, 3]]
    assert engine_spans(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError) as info:
        engine_spans(6, 4)
    assert str(info.value) == "6 bundles do not divide into engines of 4"


def test_an_engine_that_sees_several_devices_keeps_ray_from_narrowing_them():
    env = span_env({"NCCL_CUMEM_ENABLE": "0"}, "CUDA_VISIBLE_DEVICES", ["2", "3"])
    assert env == {
        "NCCL_CUMEM_ENABLE": "0",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }
    # the CPU has no device ids: nothing to set
    assert span_env({"A": "1"}, None, []) == {"A": "1"}


def test_a_ray_run_sleeps_the_engines_to_train_and_wakes_them_with_new_weights(
    gpu_ray, plugins, sim_task, tmp_path
):
    """Two trainer ranks and one engine over both of their devices, through the sync
    scheduler: the phases of each step in the order the engine saw them."""
    from plugrl.run.runner import run_recipe
    from plugrl_sim.parts import sim_recipe

    trace = tmp_path / "trace.jsonl"
    data = sim_recipe(sim_task, tmp_path / "run", train_batch_size=4, n=2, steps=2)
    data["data"]["max_response_length"] = 16
    data["device"] = "fakegpu"
    data["cluster"] = {"mode": "ray", "num_cpus": 4}
    data["trainer"]["n_gpus_per_node"] = 2
    data["actor"]["sim_devices"] = 1
    data["rollout"].pop("sim_devices")
    data["rollout"]["tensor_model_parallel_size"] = 2
    data["rollout"]["sim_trace_file"] = str(trace)
    metrics = run_recipe(build_recipe(data, plugins), plugins)
    assert metrics["training/global_step"] == 2

    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len({line["pid"] for line in lines}) == 1  # one engine for the two devices
    assert lines[0]["event"] == "start" and len(lines[0]["visible"].split(",")) == 2
    phases = [line["event"] for line in lines if line["event"] != "generate"]
    # after the first weights: per step, generate, sleep to train, wake the weights, take the
    # new version, wake the cache; a step's generation runs awake on the version just pushed
    assert phases == [
        "start",
        *["wake_up", "begin_weight_update", "finish_weight_update", "wake_up"],
        *["sleep", "wake_up", "begin_weight_update", "finish_weight_update", "wake_up"] * 2,
    ]
    generated = [line for line in lines if line["event"] == "generate"]
    assert generated and all(line["asleep"] == [] for line in generated)
    updates = [line for line in lines if line["event"] == "finish_weight_update"]
    assert [line["version"] for line in updates] == [0, 1, 2]
    first_sleep = next(i for i, line in enumerate(lines) if line["event"] == "sleep")
    assert all(line["version"] == 0 for line in lines[:first_sleep] if line in generated)
