"""The sbatch script ``plugrl launch --slurm`` writes, run on this machine as Slurm would run
it on two nodes: ``srun`` and ``scontrol`` are stand-ins that run each step here, so the
script's own ``ray start`` commands make a two-node Ray cluster (each raylet with working
folders of its own, as on two machines), and its ``plugrl run`` joins it by address and trains
a recipe of relative paths with a rank and an engine on each node. This is the suite's one
training run on a cluster of several nodes; tests/e2e/test_multinode.py checks on one what
each node sees."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from plugrl.plugin.manager import get_plugin_manager
from plugrl_tools.launch import prepare_launch, write_job
from tests.e2e.e2e_support import by_step, cli_env, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow

SRUN = """#!/bin/bash
# srun on one machine: the step runs here, in place of this process
while [ $# -gt 0 ]; do
    case "$1" in
        -w|--nodelist) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
exec "$@"
"""
SCONTROL = """#!/bin/bash
# scontrol show hostnames: the job's two nodes
[ "$1 $2" = "show hostnames" ] && printf 'node1\\nnode2\\n'
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _processes_under(folder: str) -> list[int]:
    """Processes whose command line names ``folder``: the Ray processes of a cluster whose
    temporary folder it is (their session folder is inside)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if folder in command:
            found.append(int(entry.name))
    return found


def test_the_sbatch_script_starts_a_two_node_ray_cluster_and_trains_on_it(tiny_task, tmp_path):
    """The job's two nodes hold a trainer rank each and one engine of two devices whose span
    crosses them (rollout.tensor_model_parallel_size=2), its model split over a rank on each
    node: after the update, the engine's log-probs of what it sampled equal the trainer's, so
    both shards of the weights reached it."""
    project = tmp_path / "project"
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    recipe = tiny_recipe(
        tiny_task,
        Path("run"),
        trainer={"val_before_train": False, "total_training_steps": 2, "save_freq": 2},
        launch={
            "workdir": str(project),
            "ray_port": _free_port(),
            # one CPU a node, as each rank and engine takes one
            "ray_args": ["--num-cpus=1"],
            "node_timeout_s": 60,
            "network_interface": "lo",
            "env": {"OMP_NUM_THREADS": "1"},
        },
    )
    # the paths as a user writes them: relative to the folder the run starts in
    recipe["model"]["path"] = os.path.relpath(recipe["model"]["path"], project)
    for key in ("train_files", "val_files"):
        recipe["data"][key] = [os.path.relpath(path, project) for path in recipe["data"][key]]
    function = recipe["reward"]["custom_function"]
    function["path"] = os.path.relpath(function["path"], project)
    recipe_file = write_recipe(project / "recipe.yaml", recipe)
    script = project / "job.sbatch"
    launch = prepare_launch(
        str(recipe_file),
        ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "rollout.tensor_model_parallel_size=2"],
        "slurm",
        get_plugin_manager(),
    )
    assert (launch.job.nodes, launch.job.devices_per_node, launch.job.device) == (2, 1, "cpu")
    write_job(launch, script)
    text = script.read_text()
    assert "export GLOO_SOCKET_IFNAME=lo" in text
    assert "NCCL_SOCKET_IFNAME" not in text  # the cpu device's collectives are gloo's

    # socket paths are limited to about 100 characters: a short folder of this cluster's own
    ray_temp = tempfile.mkdtemp(prefix="plugrl-ray-", dir="/tmp")
    env = {
        **cli_env(),
        "PATH": f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "RAY_TMPDIR": ray_temp,
    }
    env.pop("RAY_ADDRESS", None)
    job = subprocess.Popen(
        ["bash", str(script)],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = ""
    try:
        output, _ = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGTERM)
        output = job.communicate(timeout=60)[0]
        pytest.fail(f"the job did not end in 300 s:\n{output[-6000:]}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _processes_under(ray_temp) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _processes_under(ray_temp)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert job.returncode == 0, output[-12000:]
    assert not left, "the job's Ray processes outlived it"
    placed = dict(re.findall(r"(\w+ (?:ranks|engines)) on 2 Ray nodes: (.*)", output))
    assert set(placed) == {"actor ranks"}, output[-4000:]  # one engine, placed on one node
    # "0 on node <id> (<ip>); 1 on node <id> (<ip>)": one on each node
    nodes = re.findall(r"(\d+) on node (\w+)", placed["actor ranks"])
    assert sorted(index for index, _ in nodes) == ["0", "1"]
    assert len({node for _, node in nodes}) == 2
    span = re.search(
        r"rollout engine 0 spans 2 Ray nodes: bundles (\d) on node (\w+); "
        r"bundles (\d) on node (\w+)",
        output,
    )
    assert span is not None, output[-4000:]
    assert sorted([span[1], span[3]]) == ["0", "1"] and span[2] != span[4]
    # the engine split its model over its span: its actor (rank 0) on bundle 0's node, its
    # worker (rank 1) on bundle 1's, each a shard, every token computed by both
    bundle_node = {span[1]: span[2], span[3]: span[4]}
    ranks = re.search(
        r"rollout engine 0 splits its model over 2 Ray nodes: "
        r"rank 0 on node (\w+); rank 1 on node (\w+)",
        output,
    )
    assert ranks is not None, output[-4000:]
    assert (ranks[1], ranks[2]) == (bundle_node["0"], bundle_node["1"])
    assert "the run's files and run folder are seen by the other 1 Ray node(s)" in output
    run_dir = project / "run"
    records = by_step(read_records(run_dir))
    assert sorted(records) == [1, 2]
    for step, record in records.items():
        assert record["training/rollout_probs_diff_max"] < 1e-6, (step, record)
    # the ranks on both nodes wrote their shares of one checkpoint into the shared folder
    assert (run_dir / "global_step_2").is_dir()
    assert not [path for path in run_dir.iterdir() if path.name.startswith(".")], "check file"
    # the run read the recipe the script wrote, in the working folder the recipe names
    written = yaml.safe_load((project / launch.job.recipe_file).read_text())
    assert written["trainer"]["nnodes"] == 2 and "launch" not in written
    recorded = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert recorded["model"]["path"] == str(tiny_task.model)
    assert recorded["data"]["train_files"] == [str(tiny_task.train_file)]
