import logging
import os

import pytest
import torch

from plugrl.cluster import worker
from plugrl.cluster.groups import make_worker_group
from plugrl.cluster.local import LocalWorkerGroup
from plugrl.data.batch import Batch
from plugrl.errors import CheckpointError, PluginError, RecipeError
from plugrl.parts.backend import ActorConfig
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, Recipe
from tests.core.cluster import cluster_fake_backend
from tests.core.cluster.cluster_fake_backend import SumRowIds


@pytest.fixture
def plugins(monkeypatch):
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_backend, name="cluster_fake_backend")
    monkeypatch.setattr(cluster_fake_backend, "PREPARED", [])
    return manager


def recipe(backend: str = "fake_dp", **cluster) -> Recipe:
    return Recipe(
        actor=ActorConfig(backend=backend, ppo_mini_batch_size=2), cluster=ClusterConfig(**cluster)
    )


def test_local_group_prepares_once_then_builds_one_rank_in_this_process(plugins, caplog):
    with caplog.at_level(logging.INFO, logger="plugrl.cluster"):
        group = make_worker_group(recipe(), "actor", device_name="cpu", plugins=plugins)
    assert isinstance(group, LocalWorkerGroup)
    group.setup(5)
    (report,) = group.execute_all("report")
    assert report["pid"] == os.getpid()
    assert report["world_size"] == 1 and report["rank_sum"] == 1
    assert report["prepared_before_init"] == [("cpu", "fake_dp")]
    assert report["total_training_steps"] == 5
    # the hook runs once per process, not once per group
    LocalWorkerGroup(recipe(), "critic", device_name="cpu", plugins=plugins)
    assert cluster_fake_backend.PREPARED == [("cpu", "fake_dp")]
    # what the plugin says it patched is logged with its name, and kept
    assert "prepare_backend(cpu, fake_dp) by cluster_fake_backend: fake patch of fake_dp" in (
        caplog.messages
    )
    assert plugins.prepared[("training_backends", "cpu", "fake_dp")] == [
        "cluster_fake_backend: fake patch of fake_dp"
    ]


def test_a_backend_whose_framework_was_imported_first_is_refused(plugins):
    import json  # noqa: F401 (the framework of fake_guarded, imported before the backend)

    with pytest.raises(PluginError) as info:
        LocalWorkerGroup(recipe("fake_guarded"), "actor", device_name="cpu", plugins=plugins)
    assert str(info.value) == (
        "json was imported in this process before prepare_backend ran for cpu + fake_guarded, "
        "so patches that must come first (MindSpeed on npu, for one) would not apply; do not "
        "import json before the run builds its parts (check the reward function's and other "
        "plugins' module imports)"
    )


def test_local_group_forwards_calls_and_results(plugins, tmp_path):
    group = LocalWorkerGroup(recipe(), "actor", device_name="cpu", plugins=plugins)
    batch = Batch({"row_id": torch.arange(4)})
    out = group.compute_log_prob(batch, calculate_entropy=True)
    assert out["log_probs"].squeeze(-1).tolist() == [0, 1, 2, 3]
    assert "entropys" in out
    assert group.compute_values(batch).squeeze(-1).tolist() == [0, 10, 20, 30]
    metrics = group.update_policy(batch, SumRowIds())
    assert metrics == {"fake/rows": 4, "fake/rank": 0, "fake/first_row": 0, "fake/objective": 6}
    assert group.update_critic(batch) == {"fake/critic_rows": 4}
    assert [(n, t.tolist()) for n, t in group.named_weights()] == [("weight", [1.0])]
    group.save_checkpoint(tmp_path)
    group.load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="rank0' is missing"):
        group.load_checkpoint(tmp_path / "absent")
    assert group.rollout_model() is None  # the fake backend has none to share
    with pytest.raises(NotImplementedError) as info:  # nor LoRA adapters to turn off
        group.compute_ref_log_prob(batch)
    assert str(info.value) == "FakeBackend trains no LoRA adapters"
    group.close()


def test_local_mode_has_one_rank(plugins):
    with pytest.raises(RecipeError) as info:
        make_worker_group(recipe(), "actor", device_name="cpu", world_size=2, plugins=plugins)
    assert str(info.value) == (
        "cluster.mode: 'local' runs one rank in this process, not 2; use cluster.mode=ray for more"
    )


def test_a_driver_plugin_a_worker_cannot_import_is_named():
    with pytest.raises(PluginError) as info:
        worker.worker_plugin_manager(["no_such_plugin_module"])
    assert str(info.value) == (
        "plugin module 'no_such_plugin_module', registered in the driver, cannot be imported in "
        "a worker (ModuleNotFoundError: No module named 'no_such_plugin_module'); install it as "
        "a package or put its folder on PYTHONPATH"
    )
