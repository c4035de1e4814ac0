"""The accelerator plugins of this repository installed as their users get them, for tests of
what happens where their libraries are absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import pip_install_into

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "plugrl-sglang": ROOT / "plugins" / "rollout" / "sglang",
    "plugrl-npu": ROOT / "plugins" / "devices" / "npu",
}


def pip_install(target: Path, *names: str) -> Path:
    """``pip install`` (not editable) the named distributions into ``target``."""
    return pip_install_into(target, *(DISTRIBUTIONS[name] for name in names))


def plugrl(*args: str, path: list[Path], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The ``plugrl`` command with ``path`` in front of the import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    return subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
