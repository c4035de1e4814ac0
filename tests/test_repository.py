"""Checks on the repository itself: CI runs the README's command, and the code is lint-clean."""

import ast
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
    """tests/run.sh with stand-ins for pip, pytest and the vLLM suite: the vLLM suite (started
    before the install, reported after the main suite) runs whether the install or the main
    suite fails or not, and any of them failing fails the whole."""
    script = (ROOT / "tests" / "run.sh").read_text()
    cases = [(0, 0, 0, 0), (0, 1, 0, 1), (0, 0, 1, 1), (0, 1, 1, 1), (1, 0, 0, 1), (1, 0, 1, 1)]
    for install, main, vllm, expected in cases:
        work = tmp_path / f"{install}{main}{vllm}"
        (work / "tests").mkdir(parents=True)
        (work / "tests" / "run.sh").write_text(script)
        bin_dir = work / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        pip = f"#!/bin/sh\necho 'Successfully installed x'\nexit {install}\n"
        (bin_dir / "pip").write_text(pip)
        (bin_dir / "python").write_text(f"#!/bin/sh\necho main-suite\nexit {main}\n")
        vllm_env = work / "plugins" / "rollout" / "vllm" / "test-env.sh"
        vllm_env.parent.mkdir(parents=True)
        vllm_env.write_text(
            '#!/bin/sh\n[ "$1" = --prepare ] && { echo vllm-prepared; exit 0; }\n'
            f"echo vllm-suite\nexit {vllm}\n"
        )
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
        where = f"install {install}, main {main}, vllm {vllm}:\n{run.stdout}{run.stderr}"
        assert run.returncode == expected, where
        lines = run.stdout.splitlines()
        assert lines.index("vllm-prepared") < lines.index("Successfully installed x"), where
        # the vLLM suite's output, kept aside while it ran, comes after the main suite's
        assert lines.index("vllm-suite") > max(
            i for i, line in enumerate(lines) if line.startswith("== the vLLM suite's report")
        ), where
        assert ("main-suite" in lines) == (install == 0), where
        main_status = "passed" if install == main == 0 else "FAILED (exit 1)"
        assert lines[-2:] == [
            f"main suite: {main_status}",
            f"vLLM suite: {'passed' if vllm == 0 else 'FAILED (exit 1)'}",
        ], where


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


# where code may unpickle with torch.load(weights_only=False): nowhere but the test helper that
# proves a planted payload is live
UNSAFE_LOAD_ALLOWED = {"tests/crafted.py"}


def _torch_loads(path: Path) -> list[tuple[int, str]]:
    """``(line, problem)`` of each ``torch.load`` in ``path`` that is not weights-only, and of
    each ``weights_only=False`` anywhere."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        weights_only = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
        if isinstance(weights_only, ast.Constant) and weights_only.value is False:
            found.append((node.lineno, "weights_only=False"))
            continue
        func = node.func
        is_torch_load = (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
        )
        # torch's default can be turned off from the environment: say it
        if is_torch_load and not (
            isinstance(weights_only, ast.Constant) and weights_only.value is True
        ):
            found.append((node.lineno, "torch.load without weights_only=True"))
    return found


def test_nothing_unpickles_checkpoint_files_the_unsafe_way():
    problems = []
    for folder in ("core", "tools", "plugins", "examples", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in UNSAFE_LOAD_ALLOWED or "/.venv/" in f"/{relative}":
                continue
            problems += [f"{relative}:{line}: {what}" for line, what in _torch_loads(path)]
    assert problems == []


def test_the_unsafe_load_check_finds_what_it_looks_for(tmp_path):
    source = tmp_path / "loads.py"
    source.write_text(
        "import torch\n"
        "torch.load('a.pt', weights_only=False)\n"
        "torch.load('b.pt')\n"
        "torch.load('c.pt', weights_only=True)\n"
        "helper('d.pt', weights_only = False)\n"
    )
    assert _torch_loads(source) == [
        (2, "weights_only=False"),
        (3, "torch.load without weights_only=True"),
        (5, "weights_only=False"),
    ]
