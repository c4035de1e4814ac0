"""What each node of a Ray cluster of two nodes (two raylets on this machine, each with a
working folder of its own, as on two machines) sees of a run's paths. The training run on two
nodes, joined by address the way a user joins a cluster, with a trainer rank on each and one
engine whose span crosses both, is tests/e2e/test_launch_slurm.py's: the cluster the sbatch
script of ``plugrl launch`` starts."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.support import stop_shared_ray

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a worker node of one CPU each. Ray keeps its sockets and the address
    of the last cluster it started in its temporary folder: a folder of this cluster's own
    keeps a plain ``ray.init()`` elsewhere (another test process) from joining it, and is
    short because socket paths are limited to about 100 characters."""
    from ray.cluster_utils import Cluster

    stop_shared_ray()  # this process joins this cluster instead
    temp = tempfile.mkdtemp(prefix="plugrl-ray-", dir="/tmp")
    saved = {key: os.environ.get(key) for key in ("RAY_TMPDIR", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_TMPDIR=temp, RAY_USAGE_STATS_ENABLED="0")
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster, {cluster.head_node.node_id, worker.node_id}
    finally:
        if cluster is not None:
            cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(temp, ignore_errors=True)


def test_each_node_checks_the_paths_where_it_runs(two_nodes, tmp_path):
    cluster, node_ids = two_nodes
    _each_node_checks_the_paths_where_it_runs(cluster, node_ids, tmp_path / "check")


def _each_node_checks_the_paths_where_it_runs(cluster, node_ids, folder):
    import ray

    from plugrl.cluster.nodes import Marker, PathCheck, Problem, ask_nodes, raise_for_problems
    from plugrl.errors import RecipeError

    model = folder / "model"
    model.mkdir(parents=True)
    checks = [
        PathCheck("model.path", "model", str(model)),
        PathCheck("data.train_files", "input", str(folder / "missing.parquet")),
    ]
    marker = Marker(str(folder / "run" / ".plugrl-node-check-x"), "token")
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        nodes = [(node["NodeID"], node["NodeManagerAddress"]) for node in ray.nodes()]
        assert {node_id for node_id, _ in nodes} == node_ids
        answers = ask_nodes(ray, nodes, checks, marker, timeout_s=300)
    finally:
        ray.shutdown()
    assert [node for node, _ in answers] == nodes
    for _, problems in answers:
        assert problems == [
            Problem("model.path", str(model), "holds no config.json"),
            Problem("data.train_files", str(folder / "missing.parquet"), "does not exist"),
            Problem(
                "trainer.default_local_dir",
                str(folder / "run"),
                "is not the run folder the driver made (a file the driver wrote there is missing)",
            ),
        ]
    with pytest.raises(RecipeError) as error:
        raise_for_problems(answers)
    node_id, address = nodes[0]
    assert str(error.value) == (
        f"model.path: {model} holds no config.json on Ray node {address} (id {node_id[:12]}), "
        "though the driver sees it (and 5 more on 2 nodes); every node must see the run's "
        "files at the same paths: put them on storage that every node mounts at the same "
        "path, or copy them to that path on each node"
    )
