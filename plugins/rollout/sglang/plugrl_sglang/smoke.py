"""Smoke test of the sglang rollout engine, for a machine with SGLang and an accelerator.

    python -m plugrl_sglang.smoke [--device auto] [--steps 2] [--workdir DIR] [--timeout S]

Checks that SGLang imports and the device is there, builds the quickstart's tiny model and
arithmetic data in ``--workdir`` (nothing is downloaded), then runs ``plugrl run quickstart``
for ``--steps`` GRPO steps with ``rollout.engine=sglang`` in a fresh process and checks each
step: losses finite, a gradient, responses sampled, and new weights pushed to the engine
(``perf/weight_sync_megabytes``). Prints the figures of each step and one PASS/FAIL line per
check; exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from plugrl.run.metrics import read_metrics
from plugrl_sglang import INSTALL
from plugrl_tools.smoke import SmokeFailure, check, each_step, parse_run_arguments, run_quickstart

CHECKED = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def library_present() -> str:
    if importlib.util.find_spec("sglang") is None:
        raise SmokeFailure(f"SGLang is not installed: {INSTALL}")
    import sglang

    return f"SGLang {getattr(sglang, '__version__', 'unknown version')}"


def device_present(device: str) -> str:
    from plugrl.plugin.manager import get_plugin_manager

    plugins = get_plugin_manager()
    if device == "auto":
        device = plugins.hook.detect_device() or "cpu"
    registry = plugins.registry("devices")
    if device not in registry:
        raise SmokeFailure(f"no device plugin {device!r} is installed")
    entry = registry.get(device)
    if not entry.available:
        raise SmokeFailure(f"device {device!r} {entry.unavailable_reason}")
    if device == "cpu" or not entry.load().is_available():
        raise SmokeFailure(f"no accelerator found (device {device!r}); SGLang needs one")
    return device


def step_figures(record: dict[str, Any]) -> str:
    generation = record.get("timing_s/gen")
    parts = [
        f"score {record['critic/score/mean']:.3f}",
        f"pg_loss {record['actor/pg_loss']:+.4f}",
        f"response length {record['response_length/mean']:.1f}",
    ]
    if generation:
        parts.append(f"generation {generation:.2f} s")
    if record.get("perf/throughput"):
        parts.append(f"throughput {record['perf/throughput']:.0f} tokens/s")
    if record.get("perf/weight_sync_megabytes_per_s"):
        parts.append(f"weight push {record['perf/weight_sync_megabytes_per_s']:.0f} MB/s")
    return ", ".join(parts)


def check_steps(records: list[dict[str, Any]], steps: int) -> list[str]:
    """One line of figures per step; a failure when a step is missing or wrong."""
    lines = []
    for step, record in each_step(records, range(1, steps + 1), CHECKED):
        if not record["response_length/mean"] > 0:
            raise SmokeFailure(f"step {step}: the engine sampled empty responses")
        if not record.get("perf/weight_sync_megabytes", 0) > 0:
            raise SmokeFailure(f"step {step}: no weights were pushed to the engine")
        lines.append(f"step {step}: {step_figures(record)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="device plugin name (default: auto)")
    args, workdir = parse_run_arguments(parser, argv, prefix="plugrl-sglang-smoke-")
    print(f"smoke test of the sglang rollout engine in {workdir}", flush=True)
    found: dict[str, str] = {}
    if not check("sglang", library_present):
        return 1

    def device() -> str:
        found["device"] = device_present(args.device)
        return found["device"]

    if not check("device", device):
        return 1
    lines: list[str] = []

    def run() -> str:
        run_dir = workdir / "run"
        overrides = (f"device.name={found['device']}", "rollout.engine=sglang")
        run_quickstart(workdir, run_dir, args.steps, *overrides, timeout=args.timeout)
        lines.extend(check_steps(list(read_metrics(run_dir)), args.steps))
        return f"{args.steps} steps"

    passed = check(f"GRPO on the quickstart with rollout.engine=sglang on {found['device']}", run)
    for line in lines:
        print(f"  {line}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
