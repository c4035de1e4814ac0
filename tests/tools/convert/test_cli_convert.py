"""``plugrl convert verl`` as a user runs it: the recipe on stdout or in a file, the report on
stderr, and each error as one line with exit status 1."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import install_hints as hints

SCRIPTS = Path(__file__).parent / "scripts"
GSM8K = str(SCRIPTS / "gsm8k_grpo_qwen2.5_0.5b.sh")


ACCELERATOR_DISTRIBUTIONS = "megatron,vllm,sglang,npu"


def plugrl(*args, cwd, disabled=ACCELERATOR_DISTRIBUTIONS):
    """The command as a user runs it where the accelerator plugins are not installed (their
    entry points disabled), or with ``disabled=""`` as this test environment has them."""
    return subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "PLUGRL_DISABLED_PLUGINS": disabled},
    )


def write_script(folder, *overrides, before=""):
    path = folder / "run.sh"
    lines = " \\\n".join(f"    {o}" for o in overrides)
    path.write_text(f"{before}python3 -m verl.trainer.main_ppo \\\n{lines}\n")
    return str(path)


def test_help_explains_the_command(tmp_path):
    result = plugrl("convert", "verl", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for phrase in (
        "Convert a verl launch SCRIPT (bash) into a plugrl recipe.",
        "The script is read, never run",
        "-o, --output FILE",
        "-e, --env NAME=VALUE",
        "plugrl-megatron",
    ):
        assert phrase in result.stdout
    assert "verl" in plugrl("convert", "--help", cwd=tmp_path).stdout


def test_convert_to_a_file_then_run_what_the_report_says(tmp_path):
    result = plugrl("convert", "verl", GSM8K, "-o", "grpo.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    written = (tmp_path / "grpo.yaml").read_text()
    assert written.startswith(
        "# Converted by `plugrl convert verl` from gsm8k_grpo_qwen2.5_0.5b.sh "
        "(verl.trainer.main_ppo, line 19).\n"
    )
    assert yaml.safe_load(written)["rollout"] == {
        "engine": "vllm",
        "n": 8,
        "gpu_memory_utilization": 0.7,
    }
    report = result.stderr.splitlines()
    assert report[0] == (
        "gsm8k_grpo_qwen2.5_0.5b.sh, line 19 (verl.trainer.main_ppo): 40 overrides, "
        "37 converted, 3 not"
    )
    assert "keys of parts not installed here or not chosen (1):" in report
    assert (
        "  line 41: actor_rollout_ref.rollout.enable_chunked_prefill=False: a key of rollout "
        f"engine 'vllm', which is not installed here ({hints.VLLM})"
    ) in report
    assert report[-3:] == [
        f"not usable here: device.name: device 'npu' is not installed: {hints.NPU}",
        f"not usable here: rollout.engine: rollout engine 'vllm' is not installed: {hints.VLLM}",
        "the rest validates: plugrl run grpo.yaml device.name=auto rollout.engine=hf "
        "--print-config",
    ]
    command = report[-1].split(": ", 1)[1].split()[1:]
    check = plugrl(*command, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert yaml.safe_load(check.stdout)["actor"]["ppo_mini_batch_size"] == 64
    assert check.stderr.splitlines()[-1] == (
        "warning: not found here: data.train_files: /home/ma-user/work/data/gsm8k/train.parquet; "
        "data.val_files: /home/ma-user/work/data/gsm8k/test.parquet; fix the paths, or check "
        "the recipe where it runs"
    )
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / name).touch()
    files = ["data.train_files=[train.parquet]", "data.val_files=[test.parquet]"]
    check = plugrl(*command, *files, cwd=tmp_path)
    assert check.returncode == 0 and "warning" not in check.stderr, check.stderr


def test_a_part_installed_without_its_library_is_named_and_the_rest_validates(tmp_path):
    """Here plugrl-npu and plugrl-vllm are installed, torch_npu and vllm are not."""
    result = plugrl("convert", "verl", GSM8K, "-o", "grpo.yaml", cwd=tmp_path, disabled="")
    assert result.returncode == 0, result.stderr
    report = result.stderr.splitlines()
    assert report[-3:-1] == [
        "not usable here: device.name: device 'npu' (plugin 'npu') is installed but cannot run "
        f"here: it needs torch_npu ({hints.TORCH_NPU})",
        "not usable here: rollout.engine: rollout engine 'vllm' (plugin 'vllm') is installed "
        f"but cannot run here: it needs vllm ({hints.VLLM})",
    ]
    assert report[-1].startswith("the rest validates: plugrl run grpo.yaml device.name=auto ")


def test_convert_to_stdout_with_env(tmp_path):
    script = write_script(
        tmp_path, "actor_rollout_ref.model.path=$MODEL", "trainer.logger=['console','wandb']"
    )
    result = plugrl("convert", "verl", script, "--env", "MODEL=/models/qwen", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    recipe = yaml.safe_load(result.stdout)
    assert recipe == {
        "model": {"path": "/models/qwen"},
        "trainer": {"logger": ["console", "wandb"]},
        "cluster": "ray",
    }
    assert (
        result.stderr.splitlines()[-1]
        == "the recipe validates: plugrl run RECIPE.yaml --print-config"
    )


def test_unresolved_variables_point_to_env(tmp_path):
    script = write_script(
        tmp_path, "data.train_batch_size=$BATCH", "data.train_files=$DATA/train.parquet"
    )
    result = plugrl("convert", "verl", script, cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr.splitlines()[1:6] == [
        "value unresolvable (1):",
        "  line 2: data.train_batch_size=$BATCH: $BATCH is not set in the script",
        "in the recipe with a placeholder to fill in (1):",
        "  line 3: data.train_files=<DATA>/train.parquet: a path to fill in ($DATA is not set in "
        "the script)",
        "  (give variables the script does not set with --env NAME=VALUE)",
    ]
    assert "train_files: [<DATA>/train.parquet]" in result.stdout
    assert "files not found here" not in result.stderr
    assert "# Fill in before running: data.train_files" in result.stdout


def test_a_recipe_that_does_not_validate_is_written_and_the_key_named(tmp_path):
    script = write_script(
        tmp_path,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    )
    result = plugrl("convert", "verl", script, "-o", "out.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "Error: the converted recipe does not validate: rollout.tensor_model_parallel_size: "
        "4 devices per engine is more than the trainer's 2 (trainer.nnodes x "
        "trainer.n_gpus_per_node), whose devices colocated engines share; use at most 2, or "
        "set rollout.colocate=false to give the engines devices of their own"
    )
    assert yaml.safe_load((tmp_path / "out.yaml").read_text())["rollout"] == {
        "tensor_model_parallel_size": 4
    }


@pytest.mark.parametrize(
    ("args", "script", "message"),
    [
        (["nope.sh"], None, "Error: script 'nope.sh' not found; check the path"),
        (["run.sh", "--env", "NOVALUE"], "", "Error: --env 'NOVALUE' is not NAME=VALUE"),
        (
            ["run.sh"],
            "echo hi\n",
            "Error: run.sh: no verl training command found; expected python3 -m "
            "verl.trainer.main_ppo (or recipe.dapo.main_dapo, or a fully_async_main) followed "
            "by its overrides",
        ),
        (["run.sh"], "A=1\nB='open\n", "Error: line 2: a ' quote is never closed"),
        (
            ["run.sh", "-o", "exists.yaml"],
            "python3 -m verl.trainer.main_ppo\n",
            "Error: exists.yaml exists; pass --force to overwrite it",
        ),
    ],
)
def test_errors_are_one_line(tmp_path, args, script, message):
    if script is not None:
        (tmp_path / "run.sh").write_text(script)
    (tmp_path / "exists.yaml").write_text("kept: true\n")
    result = plugrl("convert", "verl", *args, cwd=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (1, message)
    assert (tmp_path / "exists.yaml").read_text() == "kept: true\n"


def test_force_overwrites(tmp_path):
    (tmp_path / "out.yaml").write_text("old\n")
    script = write_script(tmp_path, "trainer.nnodes=1")
    result = plugrl("convert", "verl", script, "-o", "out.yaml", "--force", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "out.yaml").read_text()) == {"cluster": "ray"}


def test_home_is_read_from_the_environment_unless_given(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$HOME/models/qwen\n"
    )
    env = {**os.environ, "HOME": "/home/me", "PLUGRL_DISABLED_PLUGINS": ACCELERATOR_DISTRIBUTIONS}
    command = [sys.executable, "-m", "plugrl_tools.cli", "convert", "verl", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["model"] == {"path": "/home/me/models/qwen"}
    assert (
        "  read from this machine's environment: HOME=/home/me; where the run happens they may "
        "differ: give them with --env HOME=..."
    ) in result.stderr.splitlines()
    given = subprocess.run(
        [*command, "--env", "HOME=/home/you"], capture_output=True, text=True, env=env, timeout=120
    )
    assert yaml.safe_load(given.stdout)["model"] == {"path": "/home/you/models/qwen"}
    assert "read from this machine's environment" not in given.stderr
