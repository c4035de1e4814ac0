"""Helpers of the end-to-end tests: a tiny model and task, recipes for it, and the CLI run the
way a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from plugrl_tools.quickstart.untrained import UntrainedTask

# Metrics that measure the machine rather than the run: they differ between two runs of the
# same recipe.
MACHINE_METRICS = ("timing_s/", "perf/")


def tiny_recipe(task: UntrainedTask, run_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A GRPO recipe on ``task`` that takes seconds per step on a CPU: 4 prompts x 2 responses
    of at most 8 tokens, two optimizer steps per training step, float32. ``sections`` are
    merged into it section by section."""
    recipe: dict[str, Any] = {
        **task.recipe_sections(max_response_length=8),
        "device": "cpu",
        "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}},
        "rollout": {"n": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "total_training_steps": 2,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "seed": 7,
        },
    }
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(recipe.get(name), dict):
            recipe[name] = {**recipe[name], **values}
        else:
            recipe[name] = values
    return recipe


def write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def cli_command(recipe: Path, *overrides: str) -> list[str]:
    """``plugrl run RECIPE KEY=VALUE...`` with this interpreter."""
    return [sys.executable, "-m", "plugrl_tools.cli", "run", str(recipe), *overrides]


def cli_env() -> dict[str, str]:
    # one intra-op thread per process: the model is tiny, and Ray ranks share two cores
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_cli(recipe: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(recipe, *overrides),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=recipe.parent,
    )


def check_ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"plugrl run failed:\n{result.stderr[-4000:]}"
    return result


def wait_for_step(
    process: subprocess.Popen,
    metrics_file: Path,
    step: int,
    timeout_s: float = 900.0,
    unlike: str | None = None,
) -> None:
    """Until ``step`` is logged in ``metrics_file`` (which, for a rerun, must differ from
    ``unlike``, what the run before it left); fails if the run ends first. The deadline only
    catches a run that hangs: a machine under load takes minutes where an idle one takes
    seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before step {step}")
        if metrics_file.exists():
            text = metrics_file.read_text(encoding="utf-8")
            for line in text.splitlines() if text != unlike else ():
                if line.startswith(f'{{"step": {step},'):
                    return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} in {metrics_file} after {timeout_s:.0f} s")


def group_gone(pgid: int, timeout_s: float = 120.0) -> bool:
    """Whether every process of the group ``pgid`` has ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def background_run(recipe: Path, log_file: Path, *overrides: str) -> Iterator[subprocess.Popen]:
    """``plugrl run RECIPE`` started in a process group of its own, in the recipe's folder,
    its output in ``log_file``; whatever is left of the group is killed afterwards."""
    with log_file.open("w") as log:
        process = subprocess.Popen(
            cli_command(recipe, *overrides),
            cwd=recipe.parent,
            env=cli_env(),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def sigterm_after_step(
    recipe: Path, step: int, *overrides: str, timeout_s: float = 300.0
) -> tuple[int, str, bool]:
    """Run ``plugrl run RECIPE`` in a process group of its own, send SIGTERM to the driver
    (what ``kill PID``, Kubernetes and most job runners do) once ``step`` is logged, and
    return its exit status, its output and whether its whole group ended."""
    run_dir = Path(yaml.safe_load(recipe.read_text())["trainer"]["default_local_dir"])
    log_file = recipe.parent / "sigterm.log"
    with background_run(recipe, log_file, *overrides) as process:
        wait_for_step(process, run_dir / "metrics.jsonl", step)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout_s)
        gone = group_gone(process.pid)
    return returncode, log_file.read_text(encoding="utf-8"), gone


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of a run folder's metrics.jsonl, in file order."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    steps = [record["step"] for record in records]
    assert len(steps) == len(set(steps)), f"steps logged more than once: {steps}"
    return {record["step"]: record for record in records}


def run_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the machine's timings, throughput and memory."""
    return {key: value for key, value in record.items() if not key.startswith(MACHINE_METRICS)}


# These measure how far the engine's and the trainer's float32 probabilities of the same
# tokens are apart: rounding, about 1e-9 when the weights arrived. Another process's order of
# summation moves them by as much, so two runs agree on them only to far below the 1e-4 at
# which trainer.check_weight_sync warns.
NOISE_METRICS = frozenset(
    {
        "training/rollout_probs_diff_mean",
        "training/rollout_probs_diff_max",
        "training/rollout_probs_diff_std",
        "training/rollout_actor_probs_pearson_corr",
    }
)
NOISE_FLOOR = 1e-6


def assert_same_metrics(
    actual: dict[str, Any], expected: dict[str, Any], *, rel: float, abs_: float, where: str
) -> None:
    """Same metric names, and values equal within the tolerance."""
    import pytest

    actual, expected = run_metrics(actual), run_metrics(expected)
    assert sorted(actual) == sorted(expected), f"{where}: different metrics"
    different = {
        key: (actual[key], expected[key])
        for key in expected
        if actual[key]
        != pytest.approx(
            expected[key], rel=rel, abs=max(abs_, NOISE_FLOOR) if key in NOISE_METRICS else abs_
        )
    }
    assert not different, f"{where}: metrics differ (actual, expected): {different}"


# The run several tests look at: GRPO with a KL loss against the reference model, a checkpoint
# every step, validation with two samples per prompt before the first step and after the last,
# every validation sample logged, and the trained actor exported as a Hugging Face folder.
REFERENCE_SECTIONS = {
    "actor": {
        "ppo_mini_batch_size": 2,
        "optim": {"lr": 1e-3},
        "use_kl_loss": True,
        "kl_loss_coef": 0.1,
    },
    "rollout": {"n": 2, "val_kwargs": {"n": 2, "do_sample": True, "temperature": 1.0}},
    "trainer": {"log_val_generations": 8},
}
REFERENCE_STEPS = 3
REFERENCE_OVERRIDES = (
    f"trainer.total_training_steps={REFERENCE_STEPS}",
    "trainer.save_freq=1",
    "trainer.export_hf=true",
)


def reference_recipe(task: UntrainedTask, folder: Path) -> Path:
    """The reference run's recipe file in ``folder``, writing its run into ``folder/run``."""
    return write_recipe(
        folder / "recipe.yaml", tiny_recipe(task, folder / "run", **REFERENCE_SECTIONS)
    )
