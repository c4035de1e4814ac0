"""plugrl-vllm installs and imports with or without vLLM; without it the engine is listed as
unavailable with the command that installs it, and a recipe that chooses it stops at start-up
with that line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import install_hints as hints
from tests.support import pip_install_into

PLUGIN = Path(__file__).resolve().parents[4] / "plugins" / "rollout" / "vllm"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """plugrl-vllm installed by pip, as a user installs it (no dependencies: plugrl is here)."""
    target = tmp_path_factory.mktemp("site")
    return pip_install_into(target, PLUGIN)


def plugrl(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # the installed copy, not the source folder a test conftest may have put on the path
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_the_distribution_registers_the_engine(site):
    result = plugrl(site, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    row = rows["vllm"]
    assert row["distribution"] == "plugrl-vllm"
    (engine,) = row["registers"]["rollout_engines"]
    assert engine["name"] == "vllm"
    assert engine["available"] is HAS_VLLM
    if not HAS_VLLM:
        assert engine["unavailable_reason"] == f"needs vllm ({hints.VLLM})"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_choosing_the_engine_without_vllm_stops_at_start_up(site, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"rollout": {"engine": "vllm"}}), encoding="utf-8")
    result = plugrl(site, "run", str(recipe), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: rollout.engine: rollout engine 'vllm' (plugin 'vllm') is installed but cannot "
        f"run here: it needs vllm ({hints.VLLM})"
    ], result.stderr
