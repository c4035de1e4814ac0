"""Smoke test of a whole GRPO run on a real accelerator, for a machine that has one.

    python -m plugrl_cuda.smoke [--device cuda] [--ranks N] [--workdir DIR]

It builds the quickstart's untrained tiny model and a few arithmetic prompts in ``--workdir``
(nothing is downloaded; the reward scores each response by a hash of its text), then runs
``plugrl run`` in fresh processes and checks each result:

1. the device plugin finds the device;
2. three GRPO steps on one rank with a KL loss (actor and reference roles), mixed precision
   (bfloat16 compute, float32 weights) on an accelerator, a checkpoint every step, an export;
   every loss finite, every gradient norm finite and above 0 (a hash of the text is the
   reward, so responses of a prompt score differently), the device's memory metrics reported;
3. the same run asked for four steps, now with ``actor.param_offload`` (weights, gradients
   and optimizer state on the CPU between steps; what a run that ran out of memory resumes
   with), resumes from step 3 and adds only step 4;
4. with ``--ranks`` of 2 or more: two steps on that many ranks under Ray against the same two
   steps on one rank (float32), metrics equal within 1e-3.

Prints one PASS/FAIL line per check and exits 1 when any fails. The plugrl test suite runs it
with ``--device cpu`` so the script itself stays correct where no accelerator is.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from plugrl.run.metrics import read_metrics
from plugrl_tools.quickstart.untrained import UntrainedTask, build_untrained_task
from plugrl_tools.smoke import (
    SmokeFailure,
    check,
    each_step,
    grpo_recipe,
    merge_sections,
    run_plugrl,
)

CHECKED_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean")
MEMORY_METRICS = {
    "cuda": "perf/max_memory_allocated_gb",
    "cpu": "perf/cpu_memory_used_gb",
}
RANK_TOLERANCE = 1e-3


def smoke_recipe(task: UntrainedTask, device: str, run_dir: Path) -> dict[str, Any]:
    """GRPO with a KL loss on the tiny model, three steps with a checkpoint each."""
    return grpo_recipe(task, device, run_dir, trainer={"total_training_steps": 3, "save_freq": 1})


def records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's metrics by step; a step logged twice is a failure."""
    found: dict[int, dict[str, Any]] = {}
    for record in read_metrics(run_dir):
        if record["step"] in found:
            raise SmokeFailure(f"step {record['step']} was logged twice in {run_dir}")
        found[record["step"]] = record
    return found


def check_steps(run_dir: Path, steps: range, memory_metric: str | None) -> None:
    logged = records(run_dir).values()
    for step, record in each_step(logged, steps, CHECKED_METRICS, where=f" in {run_dir}"):
        if memory_metric and not record.get(memory_metric, 0) > 0:
            raise SmokeFailure(f"step {step}: no {memory_metric}")


class Smoke:
    def __init__(self, device: str, ranks: int, workdir: Path) -> None:
        self.device, self.ranks, self.workdir = device, ranks, workdir
        self.task: UntrainedTask | None = None
        self.failures = 0

    def check(self, name: str, body: Callable[[], str]) -> None:
        if not check(name, body):
            self.failures += 1

    def write(self, name: str, **changes: Any) -> tuple[Path, Path]:
        run_dir = self.workdir / name
        assert self.task is not None, "write recipes after the task is built"
        recipe = merge_sections(smoke_recipe(self.task, self.device, run_dir), changes)
        recipe_file = self.workdir / f"{name}.yaml"
        recipe_file.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        return recipe_file, run_dir

    def run(self) -> int:
        self.check("device", self.device_is_there)
        if self.failures:
            return 1
        self.task = build_untrained_task(self.workdir / "task")
        accelerator = self.device != "cpu"
        # bfloat16 compute with float32 master weights is how accelerator runs train
        dtype = {"dtype": "bfloat16"} if accelerator else {}
        recipe, run_dir = self.write("one-rank", model=dtype)
        memory = MEMORY_METRICS.get(self.device)

        def three_steps() -> str:
            run_plugrl(recipe, "trainer.export_hf=true")
            check_steps(run_dir, range(1, 4), memory)
            if not (run_dir / "hf_model" / "config.json").exists():
                raise SmokeFailure("no exported hf_model/")
            last = records(run_dir)[3]
            return f"pg_loss {last['actor/pg_loss']:+.4f}, kl_loss {last['actor/kl_loss']:.5f}"

        def resume_with_offload() -> str:
            stderr = run_plugrl(
                recipe, "trainer.total_training_steps=4", "actor.param_offload=true"
            )
            check_steps(run_dir, range(1, 5), memory)
            if "global_step_3" not in stderr:
                raise SmokeFailure("the log does not say it resumed from global_step_3")
            latest = (run_dir / "latest_checkpointed_iteration.txt").read_text().strip()
            if latest != "4":
                raise SmokeFailure(f"latest checkpoint is {latest}, not 4")
            return "continued from step 3 with its parameters offloaded"

        self.check("three steps on one rank", three_steps)
        self.check("resume with param offload", resume_with_offload)
        if self.ranks >= 2:
            self.check(f"{self.ranks} ranks under Ray match one rank", self.ranks_match)
        return 1 if self.failures else 0

    def device_is_there(self) -> str:
        from plugrl.plugin.manager import get_plugin_manager

        device_cls = get_plugin_manager().registry("devices").load(self.device)
        if not device_cls.is_available():
            raise SmokeFailure(f"the {self.device} device plugin finds no device here")
        count = device_cls().device_count()
        if count < self.ranks:
            raise SmokeFailure(f"--ranks {self.ranks} but {count} {self.device} devices")
        return f"{count} device(s)"

    def ranks_match(self) -> str:
        two_steps = ("trainer.total_training_steps=2", "trainer.save_freq=0")
        local_recipe, local_dir = self.write("match-local")
        ray_recipe, ray_dir = self.write(
            "match-ray", trainer={"n_gpus_per_node": self.ranks}, cluster="ray"
        )
        run_plugrl(local_recipe, *two_steps)
        run_plugrl(ray_recipe, *two_steps)
        local, ray = records(local_dir), records(ray_dir)
        worst = 0.0
        for step in (1, 2):
            for name in CHECKED_METRICS:
                a, b = local[step][name], ray[step][name]
                gap = abs(a - b) / max(abs(a), 1e-2)
                worst = max(worst, gap)
                if gap > RANK_TOLERANCE:
                    raise SmokeFailure(f"step {step} {name}: one rank {a}, {self.ranks} ranks {b}")
        return f"largest relative gap {worst:.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="device plugin name (default: cuda)")
    parser.add_argument("--ranks", type=int, default=1, help="ranks for the Ray check (>= 2)")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plugrl-smoke-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"smoke test of device {args.device!r} in {workdir}", flush=True)
    return Smoke(args.device, args.ranks, workdir).run()


if __name__ == "__main__":
    sys.exit(main())
