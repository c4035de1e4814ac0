"""The hf engine generating one quickstart step in a process with one OpenMP team against
one with two, side by side: why the same engine code generates at another speed in plugrl's
engine-group thread than on a bare loop's main thread.

torch's CPU build runs its intra-op parallelism on libgomp, which gives each thread that
starts a parallel region a team of its own, kept for the thread's life. libgomp's workers
busy-wait about 3 ms for the next parallel region (300,000 spins), unless the process holds
more OpenMP threads than CPUs: then they spin 100 times and sleep on a futex, and each of the
thousands of small parallel regions of a decode wakes them again. A bare loop (and TRL) has
one team. plugrl's sync step has two: the trainer's on the main thread and the engine's on
the engine group's thread, so on 2 CPUs at 2 threads it always runs the short wait.

Each case runs in a process of its own (two rounds, in turns), generating the bench's
quickstart steps (32 prompts x 8 samples, the hf engine as ``bench_overhead.py``'s bare loop
binds it): ``one team``: on the main thread; ``two teams``: on an event-loop thread after the
main thread ran one parallel matrix product. Prints wall and CPU seconds per generation.

    .venv/bin/python bench/bench_omp_teams.py [--steps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ("one team", "two teams")


def generate_steps(case: str, quickstart_dir: str | None, steps: int, threads: int) -> None:
    """Run in a process of its own: one warm-up generation, then ``steps`` timed ones."""
    import torch

    torch.set_num_threads(threads)
    from bench_overhead import BareLoop, OverheadSettings

    from plugrl.loop_thread import EventLoopThread
    from plugrl.parts.rollout import batch_requests
    from plugrl.run.steps import sampling_params
    from plugrl_tools.quickstart import DEFAULT_DIR, prepare_quickstart

    paths = prepare_quickstart(Path(quickstart_dir or DEFAULT_DIR))
    settings = OverheadSettings(
        model_path=str(paths.model_path),
        train_file=str(paths.train_file),
        run_dir=tempfile.mkdtemp(prefix="bench-omp-teams-"),
        threads=threads,
        total_steps=steps + 1,
    )
    bare = BareLoop(settings)
    engine_thread = EventLoopThread("engine-group")
    if case == "two teams":
        matrix = torch.randn(512, 512)
        (matrix @ matrix).sum()  # the main thread's own team, as the trainer's

    async def generate_all(step: int) -> list[Any]:
        params = sampling_params(bare.recipe, step)
        requests = batch_requests(bare.prompts[step - 1].prompt_ids, params, f"step{step}")
        return list(await asyncio.gather(*(bare.engine.generate_request(r) for r in requests)))

    for step in range(1, steps + 2):
        wall, cpu = time.perf_counter(), time.process_time()
        if case == "one team":
            bare.loop.run_until_complete(generate_all(step))
        else:
            engine_thread.submit(generate_all(step)).result()
        if step > 1:
            print(f"{time.perf_counter() - wall:.3f} {time.process_time() - cpu:.3f}", flush=True)
    engine_thread.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quickstart-dir", default=None, help="default: plugrl's quickstart")
    parser.add_argument("--steps", type=int, default=3, help="timed generations per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per case, in turns")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        generate_steps(args.case, args.quickstart_dir, args.steps, args.threads)
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    walls: dict[str, list[float]] = {case: [] for case in CASES}
    cpus: dict[str, list[float]] = {case: [] for case in CASES}
    for round_index in range(args.rounds):
        for case in CASES if round_index % 2 == 0 else reversed(CASES):
            command = [sys.executable, __file__, "--case", case, "--steps", str(args.steps)]
            command += ["--threads", str(args.threads)]
            if args.quickstart_dir:
                command += ["--quickstart-dir", args.quickstart_dir]
            output = subprocess.run(
                command, env=env, check=True, capture_output=True, text=True
            ).stdout
            for line in output.split("\n"):
                if line.strip():
                    wall, cpu = (float(value) for value in line.split())
                    walls[case].append(wall)
                    cpus[case].append(cpu)
    print(f"hf engine, one quickstart step's generation, {args.threads} threads, load {load()}")
    for case in CASES:
        print(
            f"{case:>9}: wall {statistics.median(walls[case]):.2f} s, CPU "
            f"{statistics.median(cpus[case]):.2f} s (median of {len(walls[case])}; walls "
            f"{' '.join(f'{wall:.2f}' for wall in walls[case])})"
        )
    one, two = (statistics.median(walls[case]) for case in CASES)
    print(f"two teams / one team: wall {two / one:.2f}x")


def load() -> str:
    """The 1-minute load average, or '?' where it cannot be read."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
