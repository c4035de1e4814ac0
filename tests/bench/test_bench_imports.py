"""The benchmarks and tools run without the test extras: nothing they import needs pytest, and a
benchmark that needs more than plugrl says what in one line."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def imported_modules(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    # this repository's packages: the kernel (plugrl), the tools and the plugins (plugrl_*)
    return {name for name in found if name.partition(".")[0].startswith("plugrl")}


def test_imported_modules_reads_imports_inside_functions(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import os\nimport plugrl\n\n\ndef main():\n    from plugrl.testing import make_recipe\n"
        "    import plugrl_sim.parts, torch\n"
    )
    assert imported_modules(module) == {"plugrl", "plugrl.testing", "plugrl_sim.parts"}


def test_benches_tools_and_the_test_kit_import_without_pytest(tmp_path):
    # a sitecustomize that runs before anything else makes `import pytest` fail, as in a
    # virtualenv without the test extras
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pytest'] = None\n")
    benches = sorted(path.stem for path in BENCH.glob("*.py"))
    modules = sorted({name for path in BENCH.glob("*.py") for name in imported_modules(path)})
    assert "bench_async_sim" in benches and "plugrl.testing" in modules
    script = f"""
import importlib, pkgutil
try:
    import pytest
except ImportError:
    pass
else:
    raise SystemExit("pytest imported: the check would prove nothing")
import plugrl.testing, plugrl_tools
tools = [info.name for info in pkgutil.walk_packages(plugrl_tools.__path__, "plugrl_tools.")]
for name in ["plugrl.testing.tiny", *tools, *{modules!r}, *{benches!r}]:
    importlib.import_module(name)
print("imported", len(tools), "tool modules")
"""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), str(BENCH), *filter(None, [environ.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("imported ")


def load_bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """Make ``missing`` look not installed to ``importlib.util.find_spec``."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == missing else find_spec(name, *args),
    )


def test_the_vllm_bench_says_where_it_runs(monkeypatch):
    bench = load_bench("bench_vllm_rollout")
    without(monkeypatch, "vllm")
    with pytest.raises(SystemExit) as info:
        bench.main(["--prompts", "1"])
    assert str(info.value) == (
        "bench_vllm_rollout needs vLLM and plugrl-vllm: run it with .venv-vllm/bin/python "
        "(plugins/rollout/vllm/test-env.sh builds .venv-vllm)"
    )


def test_the_weight_transport_bench_says_it_needs_ray(monkeypatch):
    bench = load_bench("bench_weight_transport")
    without(monkeypatch, "ray")
    with pytest.raises(SystemExit) as info:
        bench.main(["--repeats", "1"])
    assert str(info.value) == (
        "bench_weight_transport needs Ray for its object_store and collective cases: "
        "pip install -c constraints/cpu.txt -e '.[ray]'"
    )


def test_the_reward_overlap_bench_needs_a_step_after_the_warm_up():
    bench = load_bench("bench_reward_overlap")
    with pytest.raises(SystemExit) as info:
        bench.main(["--steps", "1"])
    assert str(info.value) == "--steps 1: the first step is warm-up, so at least 2"


@pytest.mark.slow
def test_the_reward_overlap_bench_runs_both_modes(tmp_path, capsys):
    bench = load_bench("bench_reward_overlap")
    small = ["--latency", "0.01", "--repeats", "1", "--steps", "2", "--batch", "2"]
    small += ["--naive-batch", "1", "--n", "2", "--max-response-length", "16"]
    assert bench.main([*small, "--step-ms", "1", "--work-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "parallel (2 prompts x 2 responses per step, 8 workers)" in printed
    assert "naive (1 prompts x 2 responses per step)" in printed
    assert printed.count("on / off: ") == 2
