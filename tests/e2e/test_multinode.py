"""A Ray cluster of two nodes (two raylets on this machine, each with a working folder of its
own, as on two machines): what each node sees of a run's paths, and a run joined by address
whose one engine spans both nodes. A run with a trainer rank and an engine on each node is
tests/e2e/test_launch_slurm.py's: the cluster the sbatch script of ``plugrl launch`` starts."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.e2e.e2e_support import (
    by_step,
    check_ok,
    read_records,
    run_cli,
    tiny_recipe,
    write_recipe,
)

pytestmark = pytest.mark.slow

SPREAD = re.compile(r"(\w+ (?:ranks|engines)) on 2 Ray nodes: (.*)")


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a worker node of one CPU each. Ray keeps its sockets and the address
    of the last cluster it started in its temporary folder: a folder of this cluster's own
    keeps a plain ``ray.init()`` elsewhere (another test process) from joining it, and is
    short because socket paths are limited to about 100 characters."""
    from ray.cluster_utils import Cluster

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


def _relative(path: str, start: Path) -> str:
    return os.path.relpath(path, start)


def _train_on_both_nodes(cluster, tiny_task, recipe_dir: Path, *overrides: str):
    """``plugrl run`` of a tiny recipe of relative paths, joined to ``cluster`` by address,
    with a trainer rank on each node; the CLI's result."""
    recipe = tiny_recipe(
        tiny_task, Path("run"), trainer={"val_before_train": False, "logger": ["jsonl"]}
    )
    # the paths as a user writes them: relative to the folder plugrl run starts in
    recipe["model"]["path"] = _relative(recipe["model"]["path"], recipe_dir)
    for key in ("train_files", "val_files"):
        recipe["data"][key] = [_relative(path, recipe_dir) for path in recipe["data"][key]]
    function = recipe["reward"]["custom_function"]
    function["path"] = _relative(function["path"], recipe_dir)
    recipe_file = write_recipe(recipe_dir / "recipe.yaml", recipe)
    return check_ok(
        run_cli(
            recipe_file,
            "cluster.mode=ray",
            f"cluster.address={cluster.address}",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            *overrides,
        )
    )


def test_each_node_checks_the_paths_where_it_runs(two_nodes, tmp_path):
    cluster, node_ids = two_nodes
    _each_node_checks_the_paths_where_it_runs(cluster, node_ids, tmp_path / "check")


def test_an_engine_spanning_both_nodes_trains_with_the_trainers_weights(
    two_nodes, tiny_task, tmp_path
):
    """rollout.tensor_model_parallel_size=2 over the two nodes' one device each: one engine
    whose span crosses the nodes, on the first. A trainer rank and an engine on each node is
    tests/e2e/test_launch_slurm.py's run; here the engine's log-probs of what it sampled equal
    the trainer's after every sync, so the weights reached it across the nodes."""
    cluster, node_ids = two_nodes
    recipe_dir = tmp_path / "project"
    result = _train_on_both_nodes(
        cluster, tiny_task, recipe_dir, "rollout.tensor_model_parallel_size=2"
    )
    spread = dict(SPREAD.findall(result.stderr))
    assert set(spread) == {"actor ranks"}, result.stderr[-3000:]  # one engine: one node
    _check_spread(spread, node_ids)
    span = re.search(
        r"rollout engine 0 spans 2 Ray nodes: bundles (\d) on node (\w+); "
        r"bundles (\d) on node (\w+)",
        result.stderr,
    )
    assert span is not None, result.stderr[-3000:]
    assert sorted([span[1], span[3]]) == ["0", "1"]
    assert {
        next(node for node in node_ids if node.startswith(prefix)) for prefix in (span[2], span[4])
    } == node_ids
    assert "the run's files and run folder are seen by the other 1 Ray node(s)" in result.stderr
    run_dir = recipe_dir / "run"
    records = by_step(read_records(run_dir))
    assert sorted(records) == [1, 2]
    for step, record in records.items():
        assert record["training/rollout_probs_diff_max"] < 1e-6, (step, record)
    assert (run_dir / "global_step_2").is_dir()
    recorded = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert recorded["model"]["path"] == str(tiny_task.model)


def _check_spread(spread, node_ids):
    for what, where in spread.items():
        # "0 on node <id> (<ip>); 1 on node <id> (<ip>)": one each, on the two nodes
        placed = re.findall(r"(\d+) on node (\w+)", where)
        assert sorted(index for index, _ in placed) == ["0", "1"], what
        assert {
            next(node for node in node_ids if node.startswith(prefix)) for _, prefix in placed
        } == node_ids, what


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
