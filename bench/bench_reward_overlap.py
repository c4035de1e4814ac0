"""Scoring while generating (``reward.overlap``) against scoring after the whole batch, with a
reward that takes ``--latency`` seconds per response (a remote check, a judge), side by side
in one run.

Each run is a sync GRPO run of ``--steps`` steps through ``run_recipe``, as ``plugrl run``
runs it, of :mod:`plugrl_sim`'s simulated engine and trainer (registered here): the engine
gives a long-tailed spread of response lengths (most short, a few up to the limit), so
requests finish at different times whatever the load of the machine, and the scorer, a file
written here, sleeps ``--latency`` seconds a call. Each manager (``--managers``: ``parallel``
with ``--workers`` fixed workers, and ``naive``, one call at a time) runs with overlap off
and on in turns, ``--repeats`` times, alternating which goes first, so both see the same
load. The first step of each run is not counted (the worker pool starts then).

Printed per manager: the median seconds per step of each mode, their ratio (on / off), the
ratios of the pairs run next to each other, the median seconds the step waited for scores
(``timing_s/reward``) and spent generating (``timing_s/gen``), and the share of responses
scored before the batch came (``perf/reward_prefetched``).

    python bench/bench_reward_overlap.py [--latency 0.5] [--repeats 3] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SCORER = """
import time

LATENCY = {latency}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(LATENCY)
    return float(len(solution_str) % 2 == int(ground_truth) % 2)
"""


def run_once(
    recipe_data: dict[str, Any], plugins: Any, run_dir: Path, skip: int
) -> dict[str, float]:
    """One run; the medians over its steps after the first ``skip``."""
    from plugrl.run.runner import run_recipe
    from plugrl.testing import make_recipe

    shutil.rmtree(run_dir, ignore_errors=True)
    recipe_data["trainer"]["default_local_dir"] = str(run_dir)
    run_recipe(make_recipe(recipe_data, plugins=plugins), plugins)
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    steps = [record for record in map(json.loads, lines) if record.get("step", 0) > 0][skip:]
    if not steps:
        raise SystemExit(f"no step after the first {skip} in {run_dir}: raise --steps")
    keys = ("timing_s/step", "timing_s/gen", "timing_s/reward", "perf/reward_prefetched")
    return {key: statistics.median(step[key] for step in steps) for key in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.5, help="Seconds per scoring call.")
    parser.add_argument("--managers", default="parallel,naive", help="Reward managers.")
    parser.add_argument("--workers", type=int, default=8, help="reward.num_workers (parallel).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per mode and manager.")
    parser.add_argument(
        "--steps", type=int, default=3, help="Steps per run (the first is warm-up)."
    )
    parser.add_argument("--batch", type=int, default=12, help="Prompts per step (parallel).")
    parser.add_argument("--naive-batch", type=int, default=2, help="Prompts per step (naive).")
    parser.add_argument("--n", type=int, default=4, help="Responses per prompt.")
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument(
        "--step-ms", type=float, default=8.0, help="rollout.sim_step_ms: one decode step."
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="Where runs are written.")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise SystemExit(f"--steps {args.steps}: the first step is warm-up, so at least 2")

    import plugrl_sim
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl_sim.parts import build_sim_task, sim_recipe

    plugins = get_plugin_manager()
    if not plugins.pm.is_registered(plugrl_sim):
        plugins.register(plugrl_sim, name="plugrl-sim")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="plugrl-overlap-"))
    most_prompts = max(args.batch, args.naive_batch)
    task = build_sim_task(work_dir / "task", num_train=most_prompts * args.steps, num_val=1)
    scorer = work_dir / "slow_reward.py"
    scorer.write_text(SCORER.format(latency=args.latency), encoding="utf-8")

    def recipe(manager: str, overlap: bool) -> dict[str, Any]:
        prompts = args.batch if manager == "parallel" else args.naive_batch
        data = sim_recipe(
            task,
            work_dir / "run",
            max_response_length=args.max_response_length,
            train_batch_size=prompts,
            n=args.n,
            steps=args.steps,
        )
        data["rollout"]["sim_step_ms"] = args.step_ms
        data["reward"] = {
            "manager": manager,
            "overlap": overlap,
            "custom_function": {"path": str(scorer)},
            "timeout_s": max(30.0, 10 * args.latency),
        }
        if manager == "parallel":
            data["reward"]["num_workers"] = args.workers
        return data

    print(
        f"sync GRPO on simulated parts; a reward of {args.latency:g} s per response; "
        f"{args.n} responses per prompt, at most {args.max_response_length} tokens, "
        f"{args.step_ms:g} ms per decode step; {args.steps} steps per run, the first not "
        f"counted; {args.repeats} runs per mode",
        flush=True,
    )
    started = time.perf_counter()
    for manager in filter(None, args.managers.split(",")):
        prompts = args.batch if manager == "parallel" else args.naive_batch
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for repeat in range(args.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for overlap in order:
                runs[overlap].append(
                    run_once(recipe(manager, overlap), plugins, work_dir / "run", skip=1)
                )
        off, on = runs[False], runs[True]
        step_off = statistics.median(r["timing_s/step"] for r in off)
        step_on = statistics.median(r["timing_s/step"] for r in on)
        pairs = [b["timing_s/step"] / a["timing_s/step"] for a, b in zip(off, on, strict=True)]
        workers = f", {args.workers} workers" if manager == "parallel" else ""
        print(f"\n{manager} ({prompts} prompts x {args.n} responses per step{workers})")
        print(f"  {'overlap':8} {'s/step':>7} {'gen s':>7} {'reward s':>9} {'prefetched':>11}")
        for label, mode in (("off", off), ("on", on)):
            values = [statistics.median(r[key] for r in mode) for key in mode[0]]
            step, gen, reward, prefetched = values
            print(f"  {label:8} {step:7.2f} {gen:7.2f} {reward:9.2f} {prefetched:11.0%}")
        print(
            f"  on / off: {step_on / step_off:.2f}x (pairs: "
            + ", ".join(f"{ratio:.2f}x" for ratio in pairs)
            + ")",
            flush=True,
        )
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
