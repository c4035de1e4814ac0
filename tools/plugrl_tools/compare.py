"""``plugrl compare RUN_DIR RUN_DIR ...``: runs side by side, sync or fully-async.

A table, one row per run, of what decides between two schedules (throughput, time per step,
idle time, staleness, pauses, reward, held-out accuracy), a line per fully-async run saying
which side held it back and which key to change (for the run's cluster mode, from the recipe
its folder recorded) and, for a run of ``staleness_threshold: 0`` with
``trigger_parameter_sync_step: 1``, that it was one-step off-policy; on request (``-o``) a PNG
of reward and accuracy against wall-clock time and against steps. Everything else is read from
each run folder's ``metrics.jsonl``; a metric a run did not log shows as ``-``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugrl.errors import PlugrlError
from plugrl.run.folder import recorded_recipe
from plugrl.run.metrics import METRICS_FILE, read_metrics
from plugrl_tools.plot import REWARD_KEY

WALL_CLOCK_KEY = "perf/wall_clock_s"
STEP_SECONDS_KEY = "timing_s/step"
TOKENS_KEY = "perf/total_num_tokens"
FINAL_REWARD_STEPS = 5
_STALE = "fully_async/count/staleness_samples"
_LAG = "fully_async/monitor/max_version_lag"


def _number(value: Any) -> float | None:
    """A finite number, or ``None`` (jsonl writes NaN and infinities as strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _accuracy(record: Mapping[str, Any]) -> float | None:
    """The step's validation accuracy: ``val-core/<source>/acc/mean@N``, averaged over the
    data sources when there are several."""
    values = [
        number
        for key, value in record.items()
        if key.startswith("val-core/") and "/acc/" in key and (number := _number(value)) is not None
    ]
    return sum(values) / len(values) if values else None


@attrs.define
class RunHistory:
    """One run folder's step records, one per step (the last one logged wins), in step order,
    each with its wall-clock second."""

    run_dir: Path
    records: list[dict[str, Any]]
    wall_clock: list[float | None]
    """Seconds since the run started at each record: ``perf/wall_clock_s``, or for runs that
    did not log it the running sum of ``timing_s/step`` (validation time not counted)."""
    wall_clock_logged: bool
    cluster_mode: str | None = None
    """``cluster.mode`` of the recipe the folder recorded last (``None`` without one)."""
    scheduler: dict[str, Any] = attrs.field(factory=dict)
    """The ``scheduler`` section of that recipe (empty without one)."""

    @classmethod
    def read(cls, run_dir: str | Path) -> RunHistory:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise PlugrlError(f"{run_dir} is not a folder; give plugrl compare run folders")
        by_step: dict[int, dict[str, Any]] = {}
        for record in read_metrics(run_dir):
            step = record.get("step")
            if isinstance(step, int):
                by_step[step] = record
        records = [by_step[step] for step in sorted(by_step)]
        if not any(_number(r.get(TOKENS_KEY)) is not None for r in records):
            raise PlugrlError(
                f"{run_dir / METRICS_FILE} has no training step yet (no {TOKENS_KEY}); "
                "compare runs that trained at least one step"
            )
        logged = any(_number(r.get(WALL_CLOCK_KEY)) is not None for r in records)
        wall_clock: list[float | None] = []
        elapsed = 0.0
        for record in records:
            if logged:
                wall_clock.append(_number(record.get(WALL_CLOCK_KEY)))
            else:
                elapsed += _number(record.get(STEP_SECONDS_KEY)) or 0.0
                wall_clock.append(elapsed)
        recipe = recorded_recipe(run_dir) or {}
        cluster = recipe.get("cluster")
        mode = cluster.get("mode") if isinstance(cluster, Mapping) else None
        scheduler = recipe.get("scheduler")
        return cls(
            run_dir,
            records,
            wall_clock,
            logged,
            mode if isinstance(mode, str) else None,
            dict(scheduler) if isinstance(scheduler, Mapping) else {},
        )

    def values(self, key: str) -> list[float]:
        return [v for r in self.records if (v := _number(r.get(key))) is not None]

    def last(self, key: str) -> float | None:
        values = self.values(key)
        return values[-1] if values else None

    def training(self) -> list[tuple[dict[str, Any], float | None]]:
        """The records of training steps (not the validation before the first), with their
        wall-clock seconds."""
        return [
            (record, clock)
            for record, clock in zip(self.records, self.wall_clock, strict=True)
            if _number(record.get(TOKENS_KEY)) is not None
        ]

    def series(self, value_of: Any) -> tuple[list[tuple[int, float]], list[tuple[float, float]]]:
        """``value_of(record)`` against steps and against wall-clock seconds."""
        by_step, by_time = [], []
        for record, clock in zip(self.records, self.wall_clock, strict=True):
            value = value_of(record)
            if value is None:
                continue
            by_step.append((record["step"], value))
            if clock is not None:
                by_time.append((clock, value))
            elif record["step"] == 0:
                by_time.append((0.0, value))
        return by_step, by_time


def _rate(history: RunHistory, amount_of: Any) -> float | None:
    """Per second between the first and the last training step: what the steps after the
    first produced over the wall time they took (start-up and the first step's warm-up are
    left out)."""
    steps = [(record, clock) for record, clock in history.training() if clock is not None]
    if len(steps) < 2:
        return None
    seconds = steps[-1][1] - steps[0][1]
    amounts = [amount_of(record, steps[i][1]) for i, (record, _) in enumerate(steps[1:])]
    known = [amount for amount in amounts if amount is not None]
    if seconds <= 0 or not known:
        return None
    return sum(known) / seconds


def summarize(history: RunHistory) -> dict[str, float | None]:
    """The comparison table's row of one run (``None`` where the run logged no such metric)."""
    training = [record for record, _ in history.training()]
    rewards = [v for r in training if (v := _number(r.get(REWARD_KEY))) is not None]
    accuracy = [a for r in history.records if (a := _accuracy(r)) is not None]
    step_seconds = [
        v
        for r in training
        if (v := _number(r.get("perf/time_per_step", r.get(STEP_SECONDS_KEY)))) is not None
    ]

    def generated(record: Mapping[str, Any], previous_clock: float | None) -> float | None:
        rate = _number(record.get("fully_async/monitor/generated_tokens_per_s"))
        clock = _number(record.get(WALL_CLOCK_KEY))
        if rate is None or clock is None or previous_clock is None:
            return None
        return rate * (clock - previous_clock)

    def mean(key: str) -> float | None:
        values = [v for r in training if (v := _number(r.get(key))) is not None]
        return sum(values) / len(values) if values else None

    old_log_prob, step_total = mean("timing_s/old_log_prob"), mean(STEP_SECONDS_KEY)
    staleness = [v for r in training if (v := _number(r.get(_STALE))) is not None]
    lags = [v for r in training if (v := _number(r.get(_LAG))) is not None]
    last_clock = history.training()[-1][1]
    return {
        "steps": float(training[-1]["step"]),
        "wall_clock_s": last_clock,
        "trained_tokens_per_s": _rate(history, lambda r, _: _number(r.get(TOKENS_KEY))),
        "generated_tokens_per_s": _rate(history, generated),
        "median_step_s": statistics.median(step_seconds) if step_seconds else None,
        "rollouter_idle": mean("fully_async/rollouter/idle_ratio"),
        "rollouter_paused": mean("fully_async/rollouter/paused_ratio"),
        "trainer_idle": mean("fully_async/trainer/idle_ratio"),
        "old_log_prob_share": (
            old_log_prob / step_total if old_log_prob is not None and step_total else None
        ),
        "stale_samples": sum(staleness) if staleness else None,
        "dropped_samples": history.last("fully_async/count/dropped_stale_samples"),
        "generated_samples": history.last("fully_async/count/total_generated_samples"),
        "max_version_lag": max(lags) if lags else None,
        "lag_bound": history.last("fully_async/monitor/version_lag_bound"),
        "pauses": history.last("fully_async/count/pauses"),
        "reward_last": rewards[-1] if rewards else None,
        "reward_last5": (
            sum(rewards[-FINAL_REWARD_STEPS:]) / len(rewards[-FINAL_REWARD_STEPS:])
            if rewards
            else None
        ),
        "val_acc_first": accuracy[0] if accuracy else None,
        "val_acc_last": accuracy[-1] if accuracy else None,
    }


COLUMNS: list[tuple[str, tuple[str, str], str]] = [
    # (summary key, header on two lines, format): two short lines keep the table of two sync
    # runs under 100 characters
    ("steps", ("", "steps"), "{:.0f}"),
    ("wall_clock_s", ("wall", "s"), "{:.1f}"),
    ("trained_tokens_per_s", ("trained", "tok/s"), "{:.1f}"),
    ("generated_tokens_per_s", ("gen", "tok/s"), "{:.1f}"),
    ("median_step_s", ("median", "step s"), "{:.2f}"),
    ("rollouter_idle", ("gen", "idle"), "{:.2f}"),
    ("trainer_idle", ("train", "idle"), "{:.2f}"),
    ("stale_samples", ("", "stale"), "{:.0f}"),
    ("dropped_samples", ("", "dropped"), "{:.0f}"),
    ("max_version_lag", ("max", "lag"), "{:.0f}"),
    ("pauses", ("", "pauses"), "{:.0f}"),
    ("reward_last", ("reward", "last"), "{:.3f}"),
    ("reward_last5", ("reward", f"last{FINAL_REWARD_STEPS}"), "{:.3f}"),
    ("val_acc_first", ("val acc", "first"), "{:.3f}"),
    ("val_acc_last", ("val acc", "last"), "{:.3f}"),
]


TRAINER_WAITS = 0.2
"""A fully-async trainer that waited for samples this share of its time or more was held back
by generation."""
AT_THE_BOUND = 0.5
"""A rollouter that started nothing this share of the time or more was held back by the
staleness bound."""
OLD_LOG_PROB_SHARE = 0.05
"""An old log-prob pass taking this share of a trainer-bound step or more is worth naming."""
DROPPED_SHARE = 0.05
"""Dropping this share of the generated samples or more is worth a line of its own."""


def diagnose(summary: Mapping[str, float | None], cluster_mode: str | None = None) -> list[str]:
    """What held a fully-async run back, from its mean idle and paused ratios, and the key to
    change for a run of ``cluster_mode`` (devices are given to the trainer or the engines only
    on Ray: a ``local`` run is told to move there); nothing for a run without the fully-async
    metrics."""
    one_process = cluster_mode == "local"
    trainer_idle = summary.get("trainer_idle")
    if trainer_idle is None:
        return []
    paused = summary.get("rollouter_paused")
    engines_idle = summary.get("rollouter_idle")
    waits = f"the trainer waited for samples {trainer_idle:.0%} of the time"
    if trainer_idle < TRAINER_WAITS:
        idle = (
            "" if engines_idle is None else f" and the engines had nothing to do {engines_idle:.0%}"
        )
        share = summary.get("old_log_prob_share")
        cheaper = (
            f", or skip the old log-prob pass, {share:.0%} of its step "
            "(scheduler.use_rollout_log_probs: true)"
            if share is not None and share >= OLD_LOG_PROB_SHARE
            else ""
        )
        devices = (
            "it trained in one process (cluster.mode=local): run it on Ray to give the trainer "
            "devices of its own (cluster.mode=ray with trainer.n_gpus_per_node and "
            "rollout.n_gpus_per_node)"
            if one_process
            else "give the trainer more devices (trainer.n_gpus_per_node) and the engines fewer "
            "(rollout.n_gpus_per_node)"
        )
        lines = [
            f"the trainer is the bottleneck: {waits}{idle}; {devices}{cheaper}; a higher "
            "staleness_threshold will not help"
        ]
    elif paused is not None and paused >= AT_THE_BOUND:
        lines = [
            f"the staleness bound holds generation back: {waits} while the rollouter sat at "
            f"max_required_samples {paused:.0%} of the time; raise "
            "scheduler.staleness_threshold (older samples) or "
            "scheduler.trigger_parameter_sync_step (fewer, larger weight periods)"
        ]
    else:
        devices = (
            "raise scheduler.max_in_flight_per_engine, or run on Ray to give the engines "
            "devices of their own (cluster.mode=ray with rollout.n_gpus_per_node)"
            if one_process
            else "give the engines more devices (rollout.n_gpus_per_node) or raise "
            "scheduler.max_in_flight_per_engine"
        )
        lines = [
            f"generation is the bottleneck: {waits} and the staleness bound seldom stopped the "
            f"rollouter; {devices}"
        ]
    dropped, generated = summary.get("dropped_samples"), summary.get("generated_samples")
    if dropped and generated and dropped / generated >= DROPPED_SHARE:
        bound = summary.get("lag_bound")
        versions = "" if bound is None else f" of {bound:.0f} weight versions"
        lines.append(
            f"{dropped:.0f} of {generated:.0f} generated samples ({dropped / generated:.0%}) were "
            f"dropped as older than the strict bound{versions}: long responses outlive it, so "
            "training leans to short ones; scheduler.max_version_lag: null (verl's rule) "
            "trains them all, a higher scheduler.max_version_lag drops fewer"
        )
    return lines


def off_policy_note(
    scheduler: Mapping[str, Any], summary: Mapping[str, float | None]
) -> str | None:
    """For a fully-async run whose recipe has ``staleness_threshold: 0`` and
    ``trigger_parameter_sync_step: 1`` (what verl users set to compare with sync), the line
    saying it is one-step off-policy, not a synchronous run; ``None`` for any other run."""
    if (
        scheduler.get("name") != "fully_async"
        or scheduler.get("staleness_threshold") != 0
        or scheduler.get("trigger_parameter_sync_step") != 1
    ):
        return None
    lag = summary.get("max_version_lag")
    largest = "" if lag is None else f" (largest lag seen: {lag:.0f})"
    return (
        "staleness_threshold 0 with trigger_parameter_sync_step 1 is one-step off-policy, not "
        "sync: the engines generate the next step's samples while the trainer trains, with "
        f"weights a version behind{largest}; for on-policy training compare with scheduler: sync"
    )


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's folder name; runs whose names repeat get their parent folder in front."""
    names = [path.name or str(path) for path in run_dirs]
    return [
        f"{path.parent.name}/{name}" if names.count(name) > 1 else name
        for path, name in zip(run_dirs, names, strict=True)
    ]


def format_table(labels: Sequence[str], rows: Sequence[Mapping[str, float | None]]) -> str:
    """The rows as an aligned text table under a two-line header, ``-`` for a missing value;
    a column that no run logged (the fully-async ones, when every run is sync) is left out."""
    columns = [
        (key, header, form)
        for key, header, form in COLUMNS
        if any(row.get(key) is not None for row in rows)
    ]
    lines = [["", *(top for _, (top, _), _ in columns)], ["run", *(b for _, (_, b), _ in columns)]]
    for label, row in zip(labels, rows, strict=True):
        cells = [label]
        for key, _, form in columns:
            value = row.get(key)
            cells.append("-" if value is None else form.format(value))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns) + 1)]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def read_runs(run_dirs: Sequence[str | Path]) -> list[RunHistory]:
    """The histories of two or more distinct run folders, or one line saying what is wrong."""
    paths = [Path(path) for path in run_dirs]
    if len(paths) < 2:
        raise PlugrlError(
            f"plugrl compare needs two run folders or more, got {len(paths)}; "
            "for one run use plugrl plot RUN_DIR"
        )
    seen: set[Path] = set()
    for path in paths:
        resolved = path.resolve()
        if resolved in seen:
            raise PlugrlError(f"{path} is given twice; give each run folder once")
        seen.add(resolved)
    return [RunHistory.read(path) for path in paths]


def plot_comparison(histories: Sequence[RunHistory], out: str | Path) -> Path:
    """Reward and validation accuracy against wall-clock time and against steps, one line per
    run; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = run_labels([history.run_dir for history in histories])
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [
        (0, lambda r: _number(r.get(REWARD_KEY)), REWARD_KEY, "Training reward", None),
        (1, _accuracy, "validation accuracy", "Validation accuracy", (0, 1)),
    ]
    for row, value_of, ylabel, title, ylim in panels:
        ax_time, ax_step = axes[row]
        for label, history in zip(labels, histories, strict=True):
            by_step, by_time = history.series(value_of)
            marker = "o" if row == 1 else "."
            if by_time:
                ax_time.plot(*zip(*by_time, strict=True), marker=marker, label=label)
            if by_step:
                ax_step.plot(*zip(*by_step, strict=True), marker=marker, label=label)
        for axis, xlabel in ((ax_time, "wall-clock seconds"), (ax_step, "step")):
            axis.set(xlabel=xlabel, ylabel=ylabel, title=f"{title} against {xlabel}")
            if ylim is not None:
                axis.set_ylim(*ylim)
            axis.grid(alpha=0.3)
            if axis.get_lines():
                axis.legend(fontsize=8)
    if not all(history.wall_clock_logged for history in histories):
        fig.text(
            0.01,
            0.005,
            f"runs without {WALL_CLOCK_KEY}: wall clock is the sum of {STEP_SECONDS_KEY}",
            fontsize=8,
        )
    fig.tight_layout()
    out_path = Path(out)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def compare_runs(
    run_dirs: Sequence[str | Path], out: str | Path | None = None
) -> tuple[str, Path | None]:
    """The comparison table of ``run_dirs`` and, when ``out`` is given, the PNG written
    there."""
    if out is not None and not Path(out).parent.is_dir():
        raise PlugrlError(f"cannot write {out}: its folder does not exist; create it or choose -o")
    histories = read_runs(run_dirs)
    labels = run_labels([history.run_dir for history in histories])
    summaries = [summarize(history) for history in histories]
    table = format_table(labels, summaries)
    notes = [
        f"{label}: {line}"
        for label, summary, history in zip(labels, summaries, histories, strict=True)
        for line in [
            *diagnose(summary, history.cluster_mode),
            *filter(None, [off_policy_note(history.scheduler, summary)]),
        ]
    ]
    if notes:
        table = "\n".join([table, "", *notes])
    return table, plot_comparison(histories, out) if out is not None else None
