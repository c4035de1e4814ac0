"""Checks on the repository itself: CI runs the README's command, and the code is lint-clean."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(cmd for cmd in readme_commands() if "pytest" in cmd)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_readme_installs_cpu_torch_through_the_constraints_file():
    for command in readme_commands()[:2]:
        assert "-c constraints/cpu.txt" in command
    assert "torch==2.13.0" in (ROOT / "constraints" / "cpu.txt").read_text()


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff is not installed",
)
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    check = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run([ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout
