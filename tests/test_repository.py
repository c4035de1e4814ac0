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
    test_command = readme_commands()[1]
    assert test_command == "tests/run.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_readme_installs_cpu_torch_through_the_constraints_file():
    assert "-c constraints/cpu.txt" in readme_commands()[0]
    assert "-c constraints/cpu.txt" in (ROOT / "tests" / "run.sh").read_text()
    assert "torch==2.13.0" in (ROOT / "constraints" / "cpu.txt").read_text()


def test_the_test_command_runs_both_suites_and_fails_if_either_fails(tmp_path):
    """tests/run.sh with stand-ins for pip, pytest and the vLLM suite: a failing main suite
    does not skip the vLLM one, and either one failing fails the whole."""
    script = (ROOT / "tests" / "run.sh").read_text()
    for main, vllm, expected in [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)]:
        work = tmp_path / f"{main}{vllm}"
        (work / "tests").mkdir(parents=True)
        (work / "tests" / "run.sh").write_text(script)
        bin_dir = work / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "pip").write_text("#!/bin/sh\necho 'Successfully installed x'\n")
        (bin_dir / "python").write_text(f"#!/bin/sh\necho main-suite\nexit {main}\n")
        vllm_env = work / "plugins" / "rollout" / "vllm" / "test-env.sh"
        vllm_env.parent.mkdir(parents=True)
        vllm_env.write_text(f"#!/bin/sh\necho vllm-suite\nexit {vllm}\n")
        fake_python3 = work / "bin" / "python3"
        fake_python3.parent.mkdir()
        fake_python3.write_text("#!/bin/sh\nexit 0\n")  # 'python3 -m venv .venv'
        for path in (
            work / "tests" / "run.sh",
            bin_dir / "pip",
            bin_dir / "python",
            vllm_env,
            fake_python3,
        ):
            path.chmod(0o755)
        env = {"PATH": f"{work / 'bin'}:/usr/bin:/bin"}
        run = subprocess.run(
            ["bash", str(work / "tests" / "run.sh")], capture_output=True, text=True, env=env
        )
        assert run.returncode == expected, run.stdout + run.stderr
        assert "main-suite" in run.stdout and "vllm-suite" in run.stdout
        assert run.stdout.rstrip().splitlines()[-2:] == [
            f"main suite: {'passed' if main == 0 else 'FAILED (exit 1)'}",
            f"vLLM suite: {'passed' if vllm == 0 else 'FAILED (exit 1)'}",
        ]


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
