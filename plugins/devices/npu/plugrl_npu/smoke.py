"""Smoke test of the npu device, for a machine with Ascend NPUs, CANN and torch_npu.

    python -m plugrl_npu.smoke [--backend fsdp2|megatron] [--engine hf] [--steps 2]
                               [--workdir DIR] [--timeout S]

Checks that torch_npu imports and sees NPUs, builds the quickstart's tiny model and arithmetic
data in ``--workdir`` (nothing is downloaded), then runs ``plugrl run quickstart`` for
``--steps`` GRPO steps with ``device.name=npu`` in a fresh process and checks: the patches of
``prepare_backend`` were applied and logged (torch_npu's fused kernels for fsdp2, MindSpeed
for megatron, which needs plugrl-megatron), and each step has finite losses, a gradient and
the NPU's memory figures. Prints the figures of each step and one PASS/FAIL line per check;
exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugrl.metrics import read_metrics

CHECKED = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")
MEMORY = "perf/max_memory_allocated_gb"
PATCH_LOG = {
    "fsdp2": "prepare_backend(npu, fsdp2) by npu: transformers Qwen2: RMSNorm -> npu_rms_norm",
    "megatron": "prepare_backend(npu, megatron) by npu: mindspeed.megatron_adaptor imported",
}


class SmokeFailure(Exception):
    """A check did not hold; the message says what was seen."""


def check(name: str, body: Callable[[], str]) -> bool:
    try:
        detail = body()
    except SmokeFailure as exc:
        print(f"FAIL {name}: {exc}", flush=True)
        return False
    print(f"PASS {name}{f': {detail}' if detail else ''}", flush=True)
    return True


def npus_present() -> str:
    from plugrl_npu.device import NpuDevice, torch_npu_present

    if not torch_npu_present():
        raise SmokeFailure(
            "torch_npu is not installed: pip install torch-npu matching your torch and CANN"
        )
    if not NpuDevice.is_available():
        raise SmokeFailure(
            "torch_npu sees no NPU (check the driver, CANN and ASCEND_RT_VISIBLE_DEVICES)"
        )
    import torch_npu

    count = NpuDevice().device_count()
    return f"{count} NPU(s), torch_npu {getattr(torch_npu, '__version__', 'unknown version')}"


def step_figures(record: dict[str, Any]) -> str:
    parts = [
        f"score {record['critic/score/mean']:.3f}",
        f"pg_loss {record['actor/pg_loss']:+.4f}",
        f"grad_norm {record['actor/grad_norm']:.4f}",
        f"max memory {record[MEMORY]:.2f} GiB",
    ]
    if record.get("perf/time_per_step"):
        parts.append(f"{record['perf/time_per_step']:.2f} s/step")
    return ", ".join(parts)


def check_steps(records: list[dict[str, Any]], steps: int) -> list[str]:
    """One line of figures per step; a failure when a step is missing or wrong."""
    by_step = {record["step"]: record for record in records}
    lines = []
    for step in range(1, steps + 1):
        record = by_step.get(step)
        if record is None:
            raise SmokeFailure(f"no metrics for step {step}")
        for name in (*CHECKED, MEMORY):
            value = record.get(name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SmokeFailure(f"step {step}: {name} is {value!r}")
        if not record["actor/grad_norm"] > 0:
            raise SmokeFailure(f"step {step}: no gradient (actor/grad_norm is 0)")
        if not record[MEMORY] > 0:
            raise SmokeFailure(f"step {step}: {MEMORY} is 0: the model did not run on the NPU")
        lines.append(f"step {step}: {step_figures(record)}")
    return lines


def check_patch_log(stderr: str, backend: str) -> str:
    expected = PATCH_LOG[backend]
    found = [line for line in stderr.splitlines() if "prepare_backend(npu, " in line]
    if not any(expected in line for line in found):
        seen = "; ".join(found) or "no prepare_backend line at all"
        raise SmokeFailure(f"the log lacks {expected!r} (seen: {seen})")
    return f"{len(found)} patch line(s) logged"


def run_quickstart(
    workdir: Path, backend: str, engine: str, steps: int, timeout: float
) -> tuple[Path, str]:
    from plugrl.quickstart import prepare_quickstart, quickstart_overrides

    paths = prepare_quickstart(workdir / "assets")
    run_dir = workdir / f"run-{backend}"
    overrides = [
        *quickstart_overrides(paths),
        "device.name=npu",
        f"actor.backend={backend}",
        f"rollout.engine={engine}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.export_hf=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]
    command = [sys.executable, "-m", "plugrl.cli", "run", "quickstart", *overrides]
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"plugrl run took over {timeout:.0f} s") from None
    if result.returncode != 0:
        raise SmokeFailure(f"plugrl run exited {result.returncode}: {result.stderr[-2000:]}")
    return run_dir, result.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fsdp2", choices=sorted(PATCH_LOG))
    parser.add_argument("--engine", default="hf", help="rollout engine (default: hf)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (default: 2)")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the run")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plugrl-npu-smoke-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"smoke test of the npu device ({args.backend}) in {workdir}", flush=True)
    if not check("npu", npus_present):
        return 1
    ran: dict[str, Any] = {}

    def run() -> str:
        run_dir, ran["stderr"] = run_quickstart(
            workdir, args.backend, args.engine, args.steps, args.timeout
        )
        ran["lines"] = check_steps(list(read_metrics(run_dir)), args.steps)
        return f"{args.steps} steps"

    run_passed = check(f"GRPO on the quickstart on npu with {args.backend} and {args.engine}", run)
    for line in ran.get("lines", []):
        print(f"  {line}", flush=True)
    patches_passed = "stderr" in ran and check(
        "patches logged", lambda: check_patch_log(ran["stderr"], args.backend)
    )
    return 0 if run_passed and patches_passed else 1


if __name__ == "__main__":
    sys.exit(main())
