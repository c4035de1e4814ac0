"""Ray worker groups with a backend that reports what reached each rank."""

import os

import pytest
import torch

from plugrl.cluster.groups import make_worker_group
from plugrl.cluster.ray_group import RayPlacement, RayWorkerGroup, in_process_plugin_modules
from plugrl.data.batch import Batch
from plugrl.errors import CheckpointError, RecipeError
from plugrl.parts.backend import ActorConfig
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, Recipe, TrainerConfig
from tests.core.cluster import cluster_fake_backend
from tests.core.cluster.cluster_fake_backend import SumRowIds
from tests.support import SHARED_RAY_CPUS, shared_ray_for_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_session():
    with shared_ray_for_module() as ray:
        yield ray


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_backend, name="cluster_fake_backend")
    return manager


def recipe(backend: str = "fake_dp") -> Recipe:
    return Recipe(
        actor=ActorConfig(backend=backend, ppo_mini_batch_size=4),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
    )


@pytest.fixture(scope="module")
def group(ray_session, plugins):
    workers = make_worker_group(recipe(), "actor", device_name="cpu", plugins=plugins)
    assert isinstance(workers, RayWorkerGroup) and workers.world_size == 1  # trainer default
    workers.close()
    # half a CPU per rank, so that a second group fits beside this one
    workers = RayWorkerGroup(
        recipe(), "actor", world_size=2, device_name="cpu", plugins=plugins, num_cpus_per_rank=0.5
    )
    workers.setup(3)
    yield workers
    workers.close()


def test_in_process_plugins_are_forwarded_by_module_name(plugins):
    assert in_process_plugin_modules(plugins) == ["tests.core.cluster.cluster_fake_backend"]


def test_each_rank_is_an_actor_in_one_process_group(group):
    reports = group.execute_all("report")
    assert [r["rank"] for r in reports] == [0, 1]
    assert len({r["pid"] for r in reports} | {os.getpid()}) == 3
    assert all(r["world_size"] == 2 and r["rank_sum"] == 3 for r in reports)
    # prepare_backend ran in each worker before the backend was built
    assert all(r["prepared_before_init"] == [("cpu", "fake_dp")] for r in reports)
    assert all(r["total_training_steps"] == 3 for r in reports)


def test_batches_are_split_by_rank_and_gathered_in_order(group):
    batch = Batch({"row_id": torch.arange(5)})
    out = group.compute_log_prob(batch)
    assert out["log_probs"].squeeze(-1).tolist() == [0, 1, 2, 3, 4]
    assert out["rank"].squeeze(-1).tolist() == [0, 0, 0, 1, 1]  # padded to 6, then cut
    assert group.compute_values(batch).squeeze(-1).tolist() == [0, 10, 20, 30, 40]


def test_updates_deal_mini_batches_and_average_metrics(group):
    batch = Batch({"row_id": torch.arange(8)})
    metrics = group.update_policy(batch, SumRowIds())
    # mini-batches of 4: rank 0 gets rows 0,1,4,5 and rank 1 rows 2,3,6,7
    assert metrics == {
        "fake/rows": 4.0,
        "fake/rank": 0.5,
        "fake/first_row": 1.0,
        "fake/objective": (10 + 18) / 2,
    }
    assert group.update_critic(batch) == {"fake/critic_rows": 4.0}
    with pytest.raises(ValueError, match="a batch of 7 rows cannot be split evenly over 2"):
        group.update_policy(Batch({"row_id": torch.arange(7)}), SumRowIds())


def test_weights_come_from_rank_zero_and_errors_keep_their_type(group, tmp_path):
    steps = group.named_weights()[0][1].item()
    assert steps >= 0 and len(group.named_weights()) == 1
    group.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    group.export_hf(tmp_path / "hf")
    assert (tmp_path / "hf" / "weights.txt").is_file()
    with pytest.raises(CheckpointError, match="is missing; start fresh"):
        group.load_checkpoint(tmp_path / "absent")
    assert group.rollout_model() is None


def test_ranks_sharing_a_data_parallel_index_get_the_same_rows(ray_session, plugins):
    workers = RayWorkerGroup(
        recipe("fake_tp"),
        "actor",
        world_size=2,
        device_name="cpu",
        plugins=plugins,
        num_cpus_per_rank=0.5,
        placement_timeout_s=60,
    )
    try:
        assert workers.dp_ranks == [0, 0] and workers.dp_size == 1
        out = workers.compute_log_prob(Batch({"row_id": torch.arange(3)}))
        assert out["log_probs"].squeeze(-1).tolist() == [0, 1, 2]
        assert out["rank"].squeeze(-1).tolist() == [0, 0, 0]  # rank 0's copy
        metrics = workers.update_policy(Batch({"row_id": torch.arange(4)}), SumRowIds())
        # the metrics are those of the rank holding the outputs, as the tensors are
        assert metrics["fake/rows"] == 4.0 and metrics["fake/rank"] == 0.0
    finally:
        workers.close()


def test_outputs_come_from_the_rank_the_backend_says_holds_them(ray_session, plugins):
    # a two-stage pipeline: the last stage holds the log-probs and the loss
    workers = RayWorkerGroup(
        recipe("fake_pp"),
        "actor",
        world_size=2,
        device_name="cpu",
        plugins=plugins,
        num_cpus_per_rank=0.5,
        placement_timeout_s=60,
    )
    try:
        assert workers.output_ranks == [False, True]
        out = workers.compute_log_prob(Batch({"row_id": torch.arange(3)}))
        assert out["rank"].squeeze(-1).tolist() == [1, 1, 1]
        metrics = workers.update_policy(Batch({"row_id": torch.arange(4)}), SumRowIds())
        assert metrics["fake/rank"] == 1.0
    finally:
        workers.close()


def test_a_backend_with_no_output_rank_is_refused_at_start(ray_session, plugins):
    with pytest.raises(RuntimeError) as info:
        RayWorkerGroup(
            recipe("fake_no_output"),
            "actor",
            world_size=2,
            device_name="cpu",
            plugins=plugins,
            num_cpus_per_rank=0.5,
            placement_timeout_s=60,
        )
    assert str(info.value) == (
        "no rank holds the outputs of data-parallel index 0; a backend's is_output_rank must "
        "be true on one rank of each"
    )


def test_a_group_larger_than_the_cluster_is_refused_at_once(ray_session, plugins):
    with pytest.raises(RecipeError) as info:
        RayWorkerGroup(recipe(), "actor", world_size=5, device_name="cpu", plugins=plugins)
    assert str(info.value) == (
        "trainer.n_gpus_per_node: 5 actor ranks need 5 CPU but the Ray cluster has 4; use fewer "
        "ranks or a bigger cluster (cluster.num_cpus for a local Ray)"
    )


def test_roles_sharing_a_placement_share_its_bundles(ray_session, plugins):
    two_ranks = Recipe(
        actor=ActorConfig(backend="fake_dp", ppo_mini_batch_size=4),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
        trainer=TrainerConfig(n_gpus_per_node=2),
    )
    # half a CPU per bundle fits beside the module's group; actor and ref ranks of their own
    # would need twice that
    placement = RayPlacement(
        two_ranks.cluster, world_size=2, resource=None, roles=["actor", "ref"], cpus_per_rank=0.5
    )
    groups = []
    try:
        for role in ("actor", "ref"):
            groups.append(
                make_worker_group(
                    two_ranks, role, device_name="cpu", plugins=plugins, placement=placement
                )
            )
        for group in groups:
            group.setup(1)
            reports = group.execute_all("report")
            assert [r["rank_sum"] for r in reports] == [3, 3]  # each role its own process group
            for report in reports:
                # a quarter CPU each: half a bundle, which the other role's rank shares
                assert report["ray"] == {
                    "resources": {"CPU": 0.25},
                    "placement_group": placement.placement_group.id.hex(),
                }
    finally:
        for group in groups:
            group.close()
        placement.close()


def test_a_shared_placement_larger_than_the_cluster_is_refused_at_once(ray_session):
    with pytest.raises(RecipeError) as info:
        RayPlacement(ClusterConfig(mode="ray"), world_size=5, resource=None, roles=["actor", "ref"])
    assert str(info.value) == (
        "trainer.n_gpus_per_node: 5 actor/ref ranks need 5 CPU but the Ray cluster has 4; use "
        "fewer ranks or a bigger cluster (cluster.num_cpus for a local Ray)"
    )


def test_workers_get_the_device_environment_under_the_users(ray_session, plugins, monkeypatch):
    monkeypatch.setenv("FAKE_USER_WINS", "user")
    workers = RayWorkerGroup(
        recipe(),
        "actor",
        world_size=1,
        device_name="envcpu",
        plugins=plugins,
        num_cpus_per_rank=0.5,
        placement_timeout_s=60,
    )
    try:
        assert workers.execute_all("env", "FAKE_ALLOC_CONF") == ["trainer-setting"]
        assert workers.execute_all("env", "FAKE_USER_WINS") == ["user"]
    finally:
        workers.close()


def test_a_rank_whose_actor_dies_is_one_line(ray_session, plugins):
    import signal

    from plugrl.errors import PluginError

    workers = RayWorkerGroup(
        recipe(),
        "actor",
        world_size=1,
        device_name="cpu",
        plugins=plugins,
        num_cpus_per_rank=0.5,
        placement_timeout_s=60,
    )
    try:
        workers.setup(1)
        (pid,) = [report["pid"] for report in workers.execute_all("report")]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(PluginError) as info:
            workers.execute_all("report")
        message = str(info.value)
        assert message.startswith("a actor rank's Ray actor died (")
        assert message.endswith(
            "its output is in Ray's worker logs (`ray logs` lists them), "
            "often an out-of-memory kill"
        )
        assert "\n" not in message
    finally:
        workers.close()
