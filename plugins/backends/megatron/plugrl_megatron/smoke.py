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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from plugrl_megatron import INSTALL
from plugrl_tools.smoke import SmokeFailure, check, check_step, grpo_recipe, run_plugrl

CHECKED_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean")


def device_count(device: str) -> int:
    import torch

    if device == "cuda":
        return torch.cuda.device_count()
    return 1


def smoke_recipe(task: Any, device: str, run_dir: Path, ranks: int) -> dict[str, Any]:
    """Two steps with the megatron backend at tensor parallelism ``ranks`` (under Ray when
    above 1), bfloat16 on an accelerator, and an export."""
    return grpo_recipe(
        task,
        device,
        run_dir,
        model={"dtype": "bfloat16" if device != "cpu" else "float32"},
        actor={"backend": "megatron", "tensor_model_parallel_size": ranks},
        trainer={"total_training_steps": 2, "export_hf": True, "n_gpus_per_node": ranks},
        cluster="ray" if ranks > 1 else "local",
    )


def megatron_core() -> str:
    try:
        import megatron.core
    except ImportError as exc:
        raise SmokeFailure(f"{exc}; {INSTALL}") from None
    return f"version {megatron.core.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    from plugrl.run.metrics import read_metrics
    from plugrl_tools.quickstart.untrained import build_untrained_task

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plugrl-megatron-smoke-"))
    if not check("megatron-core", megatron_core):
        return 1
    ranks = 2 if device_count(args.device) >= 2 else 1
    task = build_untrained_task(workdir / "task")
    run_dir = workdir / "run"
    recipe_file = workdir / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(smoke_recipe(task, args.device, run_dir, ranks)))

    def run() -> str:
        started = time.perf_counter()
        run_plugrl(recipe_file, cwd=workdir, timeout=None)
        return f"{time.perf_counter() - started:.1f} s"

    if not check(f"two GRPO steps at tensor parallelism {ranks}", run):
        return 1
    logged = {record["step"]: record for record in read_metrics(run_dir)}
    passed = True
    for step in (1, 2):

        def metrics(step: int = step) -> str:
            record = check_step(logged.get(step), step, CHECKED_METRICS)
            return ", ".join(f"{name} {record[name]}" for name in CHECKED_METRICS)

        passed &= check(f"step {step} metrics", metrics)

    def export() -> str:
        from safetensors.torch import load_file

        exported = load_file(str(run_dir / "hf_model" / "model.safetensors"))
        initial = load_file(str(Path(task.model) / "model.safetensors"))
        moved = sum(not exported[name].float().equal(initial[name].float()) for name in initial)
        if exported.keys() != initial.keys() or moved == 0:
            raise SmokeFailure(
                f"{len(exported)} weights in Hugging Face names ({len(initial)} in the model), "
                f"{moved} changed by training"
            )
        return f"{len(exported)} weights in Hugging Face names, {moved} changed by training"

    passed &= check("export", export)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
