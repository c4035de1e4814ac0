"""Sync against fully-async scheduling on simulated devices, through the real scheduler code.

The parts are :mod:`plugrl_sim`'s (a rollout engine, a training backend and a reward whose
costs are simulated in milliseconds; registered into the plugin manager here), so the
schedulers run as ``plugrl run`` runs them (``run_recipe``, one process, ``cluster: local``)
with time compressed. The workload is GRPO with long-tailed response lengths like the seeds'
DAPO runs: most responses short, a few running to the maximum length.

* sync: every step generates on all ``--devices`` simulated devices, then trains on all of
  them (colocated, as verl's hybrid engine);
* fully-async (``--async-scheduler``, default ``fully_async``): the devices split
  rollout:train (``--splits``), over a grid of ``scheduler.staleness_threshold`` values
  (``--staleness``), with ``scheduler.partial_rollout`` (``--no-partial-rollout`` turns it
  off), under each rule of ``--max-version-lag`` (``null``: verl's rule, nothing dropped for
  its age; ``auto`` or a number: the strict bound).

Each cell is one run of ``--steps`` training steps; throughput is trained tokens per second
between the first and the last step, from the run's ``metrics.jsonl`` (as ``plugrl compare``
reads it), and beside it the median tokens per step over the median step time, which a burst
of load from other processes moves less. Sync runs first and again after every
``--sync-every`` cells, and each cell is compared with the mean of the sync runs just before
and after it, so that drifting machine load moves both sides of a ratio. The table gives each
cell's throughput, its two ratios to sync, the median step time, the largest version lag of
any trained sample (``fully_async/monitor/max_version_lag``) next to the bound the scheduler
reports (``fully_async/monitor/version_lag_bound``, under the strict bound only; ``OVER``
marks a cell that broke it), the mean response length of the trained samples (the mean of
``response_length/mean``: every step trains as many responses), stale and dropped samples and
pauses.

    python bench/bench_async_sim.py [--devices 4] [--splits 1:3,2:2,3:1]
        [--staleness 0,0.25,0.5,1] [--max-version-lag null,auto] [--steps 8]
        [--async-scheduler fully_async]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SYNC = "sync"
LAG_BOUND_KEY = "fully_async/monitor/version_lag_bound"
IN_FLIGHT_KEY = "max_in_flight_per_engine"
LAG_KEY = "max_version_lag"
LENGTH_KEY = "response_length/mean"
SCALED_COSTS = (
    "sim_step_ms",
    "sim_token_ms",
    "sim_weight_load_ms",
    "sim_forward_ms_per_ktoken",
    "sim_train_ms_per_ktoken",
)


def parse_splits(text: str, devices: int) -> list[tuple[int, int]]:
    splits = []
    for item in filter(None, text.split(",")):
        rollout, _, train = item.partition(":")
        try:
            pair = (int(rollout), int(train))
        except ValueError:
            raise SystemExit(f"--splits: {item!r} is not ROLLOUT:TRAIN, e.g. 2:2") from None
        if min(pair) < 1 or sum(pair) != devices:
            raise SystemExit(
                f"--splits: {item} does not split --devices {devices} into two parts of 1 or more"
            )
        splits.append(pair)
    return splits


def run_cell(
    recipe_data: dict[str, Any], plugins: Any, label: str, work_dir: Path
) -> dict[str, Any]:
    """One run through ``run_recipe``; its summary as ``plugrl compare`` computes it."""
    from plugrl.run.runner import run_recipe
    from plugrl.testing import make_recipe
    from plugrl_tools.compare import RunHistory, summarize

    run_dir = Path(recipe_data["trainer"]["default_local_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    recipe = make_recipe(recipe_data, plugins=plugins)
    started = time.perf_counter()
    run_recipe(recipe, plugins)
    history = RunHistory.read(run_dir)
    summary = summarize(history)
    # the scheduler's own bound, when it logs it (the metric contract does not require it)
    summary["lag_bound"] = history.last(LAG_BOUND_KEY)
    # tokens per second of a typical step: robust to bursts of load from other processes
    tokens = history.values("perf/total_num_tokens")
    step_seconds = summary["median_step_s"]
    summary["median_rate"] = statistics.median(tokens) / step_seconds if step_seconds else None
    # every step trains the same number of responses: the mean of the steps' means is theirs
    lengths = history.values(LENGTH_KEY)
    summary["mean_response_length"] = statistics.fmean(lengths) if lengths else None
    summary["label"] = label
    summary["seconds"] = time.perf_counter() - started
    return summary


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table; each row's ``x sync`` is its rate over its ``baseline`` (sync's rate)."""
    header = [
        "run",
        "trained tok/s",
        "x sync",
        "x sync (medians)",
        "median step s",
        "max lag / bound",
        "mean resp len",
        "stale",
        "dropped",
        "pauses",
    ]
    lines = [header]

    def cell(value: Any, form: str) -> str:
        return "-" if value is None else form.format(value)

    def lag_cell(row: dict[str, Any]) -> str:
        lag, bound = row["max_version_lag"], row.get("lag_bound")
        if lag is None:
            return "-"
        if bound is None:
            return f"{lag:.0f} / -"
        return f"{lag:.0f} / {bound:.0f}" + (" OVER" if lag > bound else "")

    for row in rows:
        rate, baseline = row["trained_tokens_per_s"], row.get("baseline")
        ratio = rate / baseline if rate is not None and baseline else None
        median_rate, median_baseline = row.get("median_rate"), row.get("median_baseline")
        median_ratio = (
            median_rate / median_baseline if median_rate is not None and median_baseline else None
        )
        lines.append(
            [
                row["label"],
                cell(rate, "{:.0f}"),
                cell(ratio, "{:.2f}x"),
                cell(median_ratio, "{:.2f}x"),
                cell(row["median_step_s"], "{:.3f}"),
                lag_cell(row),
                cell(row.get("mean_response_length"), "{:.1f}"),
                cell(row["stale_samples"], "{:.0f}"),
                cell(row["dropped_samples"], "{:.0f}"),
                cell(row["pauses"], "{:.0f}"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            text.ljust(width) if i == 0 else text.rjust(width)
            for i, (text, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=4, help="Simulated devices in all.")
    parser.add_argument("--splits", default="1:3,2:2,3:1", help="ROLLOUT:TRAIN device splits.")
    parser.add_argument("--staleness", default="0,0.25,0.5,1", help="staleness_threshold grid.")
    parser.add_argument(
        "--max-version-lag",
        default="null,auto",
        help="scheduler.max_version_lag values of the fully-async cells, each a grid of its own: "
        "null (verl's rule: nothing dropped for its age), auto or a number of versions (the "
        "strict bound).",
    )
    parser.add_argument("--steps", type=int, default=8, help="Training steps per run.")
    parser.add_argument("--batch", type=int, default=16, help="Prompts per training step.")
    parser.add_argument("--n", type=int, default=4, help="Responses per prompt.")
    parser.add_argument(
        "--sync-step",
        type=int,
        default=1,
        help="scheduler.trigger_parameter_sync_step of the fully-async cells (K). Sync then "
        "generates K x --batch prompts per step and trains them in K mini-batches of --batch, "
        "so both take K optimizer steps per weight version; --steps counts optimizer steps.",
    )
    parser.add_argument(
        "--rollout-log-probs",
        action="store_true",
        help="scheduler.use_rollout_log_probs in the fully-async cells (the seeds' setting): "
        "the engines' log-probs are the old log-probs, no second forward pass.",
    )
    parser.add_argument("--max-response-length", type=int, default=512)
    parser.add_argument("--async-scheduler", default="fully_async", help="Scheduler to compare.")
    parser.add_argument(
        "--in-flight-per-device",
        type=int,
        default=16,
        help="Prompts in flight per simulated rollout device, for a scheduler with "
        f"scheduler.{IN_FLIGHT_KEY} (the one engine of a cell stands for one per device).",
    )
    parser.add_argument(
        "--no-partial-rollout",
        dest="partial_rollout",
        action="store_false",
        help="Run the fully-async cells without scheduler.partial_rollout.",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A recipe key for every run (rollout.sim_step_ms=4); repeatable.",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="Multiply every simulated cost: larger runs slower and leaves the host's own "
        "work (scoring, batching, Python) a smaller share of each step.",
    )
    parser.add_argument(
        "--sync-every",
        type=int,
        default=4,
        help="Run sync again after every N fully-async cells and compare each cell with the "
        "sync runs before and after it (0: sync once, first).",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="Where runs are written.")
    args = parser.parse_args(argv)
    if args.sync_step < 1:
        raise SystemExit(f"--sync-step {args.sync_step}: a weight period is 1 step or more")
    if args.steps % args.sync_step:
        raise SystemExit(f"--steps {args.steps} is not a multiple of --sync-step {args.sync_step}")

    import attrs
    import yaml

    import plugrl_sim
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl_sim.parts import SimBackendConfig, SimEngineConfig, build_sim_task, sim_recipe

    splits = parse_splits(args.splits, args.devices)
    staleness = [float(value) for value in filter(None, args.staleness.split(","))]
    lag_rules = [yaml.safe_load(value) for value in filter(None, args.max_version_lag.split(","))]
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r} is not KEY=VALUE")
        overrides[key] = yaml.safe_load(value)

    plugins = get_plugin_manager()
    if not plugins.pm.is_registered(plugrl_sim):
        plugins.register(plugrl_sim, name="plugrl-sim")
    schedulers = plugins.registry("schedulers")
    async_missing = args.async_scheduler not in schedulers
    in_flight_key = None
    if not async_missing:
        fields = attrs.fields_dict(schedulers.get(args.async_scheduler).load_config())
        in_flight_key = IN_FLIGHT_KEY if IN_FLIGHT_KEY in fields else None
        if LAG_KEY not in fields:  # a scheduler with one rule of its own
            lag_rules = [None]
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="plugrl-sim-"))
    task = build_sim_task(
        work_dir / "task", num_train=args.batch * (args.steps + 2 * args.sync_step)
    )

    def recipe(scheduler: str, label: str, **layout: Any) -> dict[str, Any]:
        # a sync step generates what the fully-async trainer takes between two weight syncs
        per_version = args.sync_step if scheduler == SYNC else 1
        data = sim_recipe(
            task,
            work_dir / label,
            scheduler=scheduler,
            max_response_length=args.max_response_length,
            train_batch_size=args.batch * per_version,
            n=args.n,
            steps=args.steps // per_version,
            **layout,
        )
        data["actor"]["ppo_mini_batch_size"] = args.batch
        for section, config_cls in (("rollout", SimEngineConfig), ("actor", SimBackendConfig)):
            for field in attrs.fields(config_cls):
                if field.name in SCALED_COSTS:
                    data[section][field.name] = field.default * args.time_scale
        for key, value in overrides.items():
            section, *path = key.split(".")
            target = data.setdefault(section, {})
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
        return data

    print(
        f"{args.devices} simulated devices; {args.batch} prompts x {args.n} responses per "
        f"optimizer step, at most {args.max_response_length} tokens; {args.steps} optimizer "
        f"steps per run, {args.sync_step} per weight version; costs x {args.time_scale:g}",
        flush=True,
    )

    def run_sync() -> None:
        number = len(sync_rows) + 1
        data = recipe(
            SYNC,
            f"sync-{number}",
            rollout_devices=args.devices,
            train_devices=args.devices,
            colocate=True,
        )
        label = f"sync {args.devices} colocated #{number}"
        sync_rows.append(run_cell(data, plugins, label, work_dir))
        print(f"  {label}: done", file=sys.stderr, flush=True)

    cells = []
    if not async_missing:
        for lag_rule, threshold, (rollout_devices, train_devices) in itertools.product(
            lag_rules, staleness, splits
        ):
            label = f"{args.async_scheduler} s={threshold:g} {rollout_devices}:{train_devices}"
            if lag_rule is not None:
                label += f" max_lag={lag_rule}"
            data = recipe(
                args.async_scheduler,
                label.replace(" ", "_").replace(":", "-"),
                rollout_devices=rollout_devices,
                train_devices=train_devices,
                colocate=False,
            )
            data["scheduler"].update(
                staleness_threshold=threshold,
                partial_rollout=args.partial_rollout,
                trigger_parameter_sync_step=args.sync_step,
            )
            if args.rollout_log_probs:
                data["scheduler"]["use_rollout_log_probs"] = True
            if in_flight_key is not None:
                # one simulated engine stands for an engine per rollout device
                data["scheduler"][in_flight_key] = args.in_flight_per_device * rollout_devices
            if lag_rule is not None:
                data["scheduler"][LAG_KEY] = lag_rule
            cells.append((label, data))
    sync_rows: list[dict[str, Any]] = []
    async_rows = []
    run_sync()
    for index, (label, data) in enumerate(cells):
        row = run_cell(data, plugins, label, work_dir)
        row["sync_before"] = len(sync_rows) - 1
        async_rows.append(row)
        print(f"  {label}: done", file=sys.stderr, flush=True)
        last = index == len(cells) - 1
        if args.sync_every and ((index + 1) % args.sync_every == 0 or last):
            run_sync()
    # each cell against the sync runs just before and after it: the machine's load drifts
    for row in [*sync_rows, *async_rows]:
        if "sync_before" in row:
            neighbours = sync_rows[row["sync_before"] : row["sync_before"] + 2]
        else:
            neighbours = sync_rows
        for key, baseline_key in (
            ("trained_tokens_per_s", "baseline"),
            ("median_rate", "median_baseline"),
        ):
            rates = [r[key] for r in neighbours if r.get(key)]
            row[baseline_key] = sum(rates) / len(rates) if rates else None
    rows = [*sync_rows, *async_rows]
    print(format_rows(rows))
    print(f"runs in {work_dir}")
    over = [
        row["label"]
        for row in rows
        if row["max_version_lag"] is not None
        and row.get("lag_bound") is not None
        and row["max_version_lag"] > row["lag_bound"]
    ]
    if over:
        print(
            f"error: trained samples beyond the staleness bound in {', '.join(over)}",
            file=sys.stderr,
        )
        return 1
    if async_missing:
        print(
            f"error: scheduler {args.async_scheduler!r} is not installed here (plugrl plugins "
            f"lists the schedulers: {', '.join(schedulers.names())}); only sync ran",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
