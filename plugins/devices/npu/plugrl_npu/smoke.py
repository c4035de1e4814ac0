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
import sys
from typing import Any

from plugrl.run.metrics import read_metrics
from plugrl_npu import INSTALL
from plugrl_tools.smoke import SmokeFailure, check, each_step, parse_run_arguments, run_quickstart

CHECKED = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")
MEMORY = "perf/max_memory_allocated_gb"
PATCH_LOG = {
    "fsdp2": "prepare_backend(npu, fsdp2) by npu: transformers Qwen2: RMSNorm -> npu_rms_norm",
    "megatron": "prepare_backend(npu, megatron) by npu: mindspeed.megatron_adaptor imported",
}


def npus_present() -> str:
    from plugrl_npu.device import NpuDevice, torch_npu_present

    if not torch_npu_present():
        raise SmokeFailure(f"torch_npu is not installed: {INSTALL}")
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
    lines = []
    for step, record in each_step(records, range(1, steps + 1), (*CHECKED, MEMORY)):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fsdp2", choices=sorted(PATCH_LOG))
    parser.add_argument("--engine", default="hf", help="rollout engine (default: hf)")
    args, workdir = parse_run_arguments(parser, argv, prefix="plugrl-npu-smoke-")
    print(f"smoke test of the npu device ({args.backend}) in {workdir}", flush=True)
    if not check("npu", npus_present):
        return 1
    ran: dict[str, Any] = {}

    def run() -> str:
        run_dir = workdir / f"run-{args.backend}"
        ran["stderr"] = run_quickstart(
            workdir,
            run_dir,
            args.steps,
            "device.name=npu",
            f"actor.backend={args.backend}",
            f"rollout.engine={args.engine}",
            timeout=args.timeout,
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
