"""SIGTERM while ``plugrl run`` waits for a reward file's import stops the run as interrupted:
the file is not blamed, and nothing prints a traceback on the way out."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.e2e_support import background_run, group_gone, tiny_recipe, write_recipe

STATUS_PLUGIN = """
import os
import pathlib

import plugrl


@plugrl.hookimpl
def on_run_end(status, metrics):
    pathlib.Path(os.environ["PLUGRL_TEST_STATUS_FILE"]).write_text(status)
"""


def install_status_plugin(site: Path) -> None:
    """A plugin, installed on ``site``, that writes the run's end status to a file."""
    dist_info = site / "plugrl_status_recorder-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plugrl-status-recorder\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[plugrl]\nstatus_recorder = plugrl_status_recorder\n"
    )
    (site / "plugrl_status_recorder.py").write_text(STATUS_PLUGIN)


@pytest.mark.slow
def test_sigterm_while_a_reward_file_imports_ends_the_run_as_interrupted(
    tiny_task, tmp_path, monkeypatch
):
    importing = tmp_path / "importing"
    reward = tmp_path / "slow_reward.py"
    reward.write_text(
        "import pathlib\nimport time\n\n"
        f"pathlib.Path({str(importing)!r}).touch()\n"
        "time.sleep(60)  # a download, a lock: under the 120 s deadline of the import\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 0.0\n"
    )
    sections = {"reward": {"custom_function": {"path": str(reward)}}}
    recipe = write_recipe(
        tmp_path / "recipe.yaml", tiny_recipe(tiny_task, tmp_path / "run", **sections)
    )
    install_status_plugin(tmp_path / "site")
    status_file = tmp_path / "status"
    paths = [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setenv("PLUGRL_TEST_STATUS_FILE", str(status_file))

    log_file = tmp_path / "run.log"
    with background_run(recipe, log_file) as process:
        deadline = time.monotonic() + 120
        while not importing.exists():
            assert process.poll() is None, log_file.read_text()
            assert time.monotonic() < deadline, "the reward file was never imported"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(300)
        assert group_gone(process.pid), "processes of the stopped run are still alive"
    log = log_file.read_text()
    assert returncode == 1, log
    assert log.rstrip().endswith("Aborted!"), log
    assert "failed to import" not in log
    assert "Traceback" not in log and "Exception ignored" not in log
    assert status_file.read_text() == "interrupted"
