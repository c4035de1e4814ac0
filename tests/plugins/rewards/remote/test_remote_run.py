"""A run whose reward comes from ``plugrl serve reward`` over HTTP scores exactly as the same
run scoring in-process (the simulated parts, same seed, a deterministic scorer)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.runner import run_recipe
from plugrl_sim.parts import sim_recipe

pytestmark = pytest.mark.slow

COMPARED = (
    "critic/score/mean",
    "critic/rewards/mean",
    "reward/plugrl/sim/score",
    "reward/plugrl/sim/acc",
)


@pytest.fixture
def served_sim_scorer(tmp_path):
    """The URL of /score of ``plugrl serve reward`` serving the simulated task's scorer."""
    path = tmp_path / "sim_reward.py"
    path.write_text("from plugrl_sim.parts import compute_score  # noqa: F401\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "plugrl_tools.cli", "serve", "reward", f"{path}:compute_score"]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "plugrl serve reward exited"
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "plugrl serve reward did not start in 120 s"
        time.sleep(0.2)
    yield f"{base}/score"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def run(sim_task, run_dir, reward):
    raw = sim_recipe(sim_task, run_dir, steps=3, train_batch_size=4, n=2, max_response_length=16)
    raw["rollout"].update(sim_step_ms=0.0, sim_token_ms=0.0)
    raw["actor"].update(sim_train_ms_per_ktoken=0.0, sim_forward_ms_per_ktoken=0.0)
    raw["reward"] = reward
    run_recipe(build_recipe(raw, get_plugin_manager()), get_plugin_manager())
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.parametrize(
    ("overlap", "calls"),
    # 4 prompts of 2 responses: the whole batch in requests of 3, or each prompt's group sent
    # as it finishes (one request each)
    [(False, 3.0), (True, 4.0)],
)
def test_remote_scores_equal_in_process_scores_step_by_step(
    sim_task, tmp_path, served_sim_scorer, overlap, calls
):
    local = run(sim_task, tmp_path / "local", {"manager": "naive"})
    remote = run(
        sim_task,
        tmp_path / "remote",
        {"manager": "remote", "url": served_sim_scorer, "batch_size": 3, "overlap": overlap},
    )
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [1, 2, 3]
    for here, there in zip(local, remote, strict=True):
        assert {k: here[k] for k in COMPARED} == {k: there[k] for k in COMPARED}
        assert there["reward/remote/calls"] == calls
        assert there["reward/errors"] == 0.0
