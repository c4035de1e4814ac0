"""plugrl-sglang and plugrl-npu installed with pip where SGLang and torch_npu are absent (as
here): they import, ``plugrl plugins --all`` lists their parts as unavailable with the reason
and the install command, and a recipe that chooses one stops at start-up with that line."""

from __future__ import annotations

import json

import pytest

from tests import install_hints as hints
from tests.accelerator_plugins import pip_install, plugrl


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return pip_install(tmp_path_factory.mktemp("site"), "plugrl-sglang", "plugrl-npu")


def test_the_parts_are_listed_as_unavailable_with_the_install_command(site):
    result = plugrl("plugins", "--all", "--json", path=[site])
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    engine = rows["sglang"]["registers"]["rollout_engines"][0]
    assert rows["sglang"]["distribution"] == "plugrl-sglang"
    assert (engine["name"], engine["available"]) == ("sglang", False)
    assert engine["unavailable_reason"] == f"needs sglang ({hints.SGLANG})"
    device = rows["npu"]["registers"]["devices"][0]
    assert rows["npu"]["distribution"] == "plugrl-npu"
    assert (device["name"], device["available"]) == ("npu", False)
    assert device["unavailable_reason"].startswith("needs torch_npu (pip install torch-npu")
    text = plugrl("plugins", "--all", path=[site]).stdout
    assert f"sglang [unavailable: needs sglang ({hints.SGLANG})]" in text


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "rollout.engine=sglang",
            "Error: rollout.engine: rollout engine 'sglang' (plugin 'sglang') is installed but "
            f"cannot run here: it needs sglang ({hints.SGLANG})",
        ),
        (
            "device=npu",
            "Error: device.name: device 'npu' (plugin 'npu') is installed but cannot run here: "
            f"it needs torch_npu ({hints.TORCH_NPU})",
        ),
    ],
)
def test_choosing_one_stops_the_run_at_start_up_with_one_line(site, tmp_path, override, line):
    result = plugrl("run", "quickstart", override, path=[site], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == line
    assert not (tmp_path / "runs").exists()  # nothing was built or written
