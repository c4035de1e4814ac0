"""Smoke test of the megatron backend on a machine with megatron-core and an accelerator.

    python -m plugrl_megatron.smoke [--device cuda] [--workdir DIR]

Builds the quickstart's untrained tiny model and a few arithmetic prompts in ``--workdir``
(nothing is downloaded), then runs two GRPO steps of ``plugrl run`` with ``actor.backend:
megatron`` and a KL loss against a megatron reference model: at tensor parallelism 2 over two
Ray ranks when the device has two or more, else on one rank. Checks that the run ends, that
every step's loss and gradient norm are finite (and the norm above 0), and that the exported
folder loads in transformers with weights that moved. One PASS/FAIL line per check; exit
status 1 when any fails.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

CHECKED_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean")


def device_count(device: str) -> int:
    import torch

    if device == "cuda":
        return torch.cuda.device_count()
    return 1


def smoke_recipe(task: Any, device: str, run_dir: Path, ranks: int) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "model": {"path": str(task.model), "dtype": "bfloat16" if device != "cpu" else "float32"},
        "data": {
            "train_files": [str(task.train_file)],
            "val_files": [str(task.val_file)],
            "train_batch_size": 4,
            "max_prompt_length": 32,
            "max_response_length": 16,
        },
        "device": device,
        "actor": {
            "backend": "megatron",
            "tensor_model_parallel_size": ranks,
            "ppo_mini_batch_size": 4,
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "optim": {"lr": 1e-4},
        },
        "rollout": {"n": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"manager": "naive", "custom_function": {"path": str(task.reward_file)}},
        "trainer": {
            "total_training_steps": 2,
            "default_local_dir": str(run_dir),
            "logger": ["jsonl"],
            "export_hf": True,
            "n_gpus_per_node": ranks,
            "seed": 1,
        },
        "cluster": "ray" if ranks > 1 else "local",
    }
    return recipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    from plugrl.metrics import read_metrics
    from plugrl.quickstart.untrained import build_untrained_task

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plugrl-megatron-smoke-"))
    failures = 0

    def report(ok: bool, name: str, detail: str) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    try:
        import megatron.core

        report(True, "megatron-core", f"version {megatron.core.__version__}")
    except ImportError as exc:
        report(False, "megatron-core", f"{exc}; pip install 'plugrl-megatron[megatron]'")
        return 1
    ranks = 2 if device_count(args.device) >= 2 else 1
    task = build_untrained_task(workdir / "task")
    run_dir = workdir / "run"
    recipe_file = workdir / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(smoke_recipe(task, args.device, run_dir, ranks)))
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "plugrl.cli", "run", str(recipe_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=workdir,
    )
    seconds = time.perf_counter() - started
    report(
        result.returncode == 0,
        f"two GRPO steps at tensor parallelism {ranks}",
        f"{seconds:.1f} s" if result.returncode == 0 else result.stderr[-2000:],
    )
    if result.returncode != 0:
        return 1
    logged = {record["step"]: record for record in read_metrics(run_dir)}
    for step in (1, 2):
        record = logged.get(step, {})
        bad = [
            name
            for name in CHECKED_METRICS
            if not isinstance(record.get(name), (int, float)) or not math.isfinite(record[name])
        ]
        moving = record.get("actor/grad_norm", 0) > 0
        figures = ", ".join(f"{name} {record.get(name)}" for name in CHECKED_METRICS)
        report(not bad and moving, f"step {step} metrics", f"{figures}; not finite: {bad}")
    from safetensors.torch import load_file

    exported = load_file(str(run_dir / "hf_model" / "model.safetensors"))
    initial = load_file(str(Path(task.model) / "model.safetensors"))
    moved = sum(not exported[name].float().equal(initial[name].float()) for name in initial)
    report(
        exported.keys() == initial.keys() and moved > 0,
        "export",
        f"{len(exported)} weights in Hugging Face names, {moved} changed by training",
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
