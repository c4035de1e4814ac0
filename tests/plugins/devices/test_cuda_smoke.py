"""The accelerator smoke script, run here on the cpu device so that it stays correct."""

from __future__ import annotations

import pytest

from plugrl_plugins.devices.cuda import smoke

pytestmark = pytest.mark.slow


def test_the_smoke_script_passes_on_cpu_with_two_ray_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert smoke.main(["--device", "cpu", "--ranks", "2", "--workdir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in {"PASS", "FAIL"}]
    assert [line.split(":")[0] for line in lines] == [
        "PASS device",
        "PASS three steps on one rank",
        "PASS resume",
        "PASS param offload",
        "PASS 2 ranks under Ray match one rank",
    ]


def test_a_failing_check_is_reported_and_fails_the_script(tmp_path, capsys):
    # more ranks than this machine has CPUs: the device check fails and nothing runs
    assert smoke.main(["--device", "cpu", "--ranks", "4096", "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL device: --ranks 4096 but" in out
    assert not (tmp_path / "task").exists()
