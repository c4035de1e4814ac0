import json
import re

import pytest
from click.testing import CliRunner

from plugrl.errors import PlugrlError
from plugrl.plugin.manager import get_plugin_manager
from plugrl_tools.cli import cli
from plugrl_tools.compare import (
    RunHistory,
    compare_runs,
    diagnose,
    format_table,
    run_labels,
    summarize,
)

VAL = "val-core/plugrl/arithmetic/acc/mean@1"


def write_run(folder, records, tail=""):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record) for record in records]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail, encoding="utf-8")
    return folder


def sync_records(steps=6, seconds_per_step=10.0, tokens=1000, with_clock=True):
    records = [{"step": 0, VAL: 0.2, **({"perf/wall_clock_s": 3.0} if with_clock else {})}]
    for step in range(1, steps + 1):
        record = {
            "step": step,
            "training/global_step": step,
            "perf/total_num_tokens": tokens,
            "perf/time_per_step": seconds_per_step,
            "timing_s/step": seconds_per_step,
            "timing_s/gen": seconds_per_step / 2,
            "critic/score/mean": step / 10,
        }
        if with_clock:
            record["perf/wall_clock_s"] = 3.0 + step * seconds_per_step
        if step % 3 == 0:
            record[VAL] = 0.2 + step / 20
        records.append(record)
    return records


def async_records(steps=6, seconds_per_step=4.0, tokens=1000):
    records = []
    for step in range(1, steps + 1):
        records.append(
            {
                "step": step,
                "training/global_step": step,
                "perf/total_num_tokens": tokens,
                "perf/time_per_step": seconds_per_step,
                "timing_s/step": seconds_per_step,
                "perf/wall_clock_s": 5.0 + step * seconds_per_step,
                "critic/score/mean": step / 5,
                "fully_async/count/staleness_samples": 2 * step,
                "fully_async/count/dropped_stale_samples": step - 1,
                "fully_async/count/pauses": step // 2,
                "fully_async/trainer/idle_ratio": 0.1,
                "fully_async/rollouter/idle_ratio": 0.3 if step % 2 else 0.5,
                "fully_async/monitor/generated_tokens_per_s": 500.0,
                "fully_async/monitor/max_version_lag": 1 if step < 4 else 2,
            }
        )
    records[-1][VAL] = 0.9
    return records


def test_summary_of_a_sync_and_an_async_run(tmp_path):
    sync = summarize(RunHistory.read(write_run(tmp_path / "sync", sync_records())))
    # tokens of steps 2..6 over the seconds between step 1 and step 6
    assert sync["trained_tokens_per_s"] == pytest.approx(5 * 1000 / 50)
    assert sync["median_step_s"] == 10.0
    assert sync["wall_clock_s"] == 63.0
    assert sync["steps"] == 6
    assert sync["reward_last"] == pytest.approx(0.6)
    assert sync["reward_last5"] == pytest.approx((0.2 + 0.3 + 0.4 + 0.5 + 0.6) / 5)
    assert sync["val_acc_first"] == pytest.approx(0.2)
    assert sync["val_acc_last"] == pytest.approx(0.5)
    for missing in (
        "generated_tokens_per_s",
        "rollouter_idle",
        "trainer_idle",
        "stale_samples",
        "dropped_samples",
        "max_version_lag",
        "pauses",
    ):
        assert sync[missing] is None, missing

    fast = summarize(RunHistory.read(write_run(tmp_path / "async", async_records())))
    assert fast["trained_tokens_per_s"] == pytest.approx(5 * 1000 / 20)
    assert fast["generated_tokens_per_s"] == pytest.approx(500.0)
    assert fast["stale_samples"] == 2 * (1 + 2 + 3 + 4 + 5 + 6)
    assert fast["dropped_samples"] == 5
    assert fast["pauses"] == 3
    assert fast["max_version_lag"] == 2
    assert fast["rollouter_idle"] == pytest.approx(0.4)
    assert fast["trainer_idle"] == pytest.approx(0.1)
    assert fast["val_acc_first"] == fast["val_acc_last"] == pytest.approx(0.9)


def test_older_runs_without_wall_clock_use_the_sum_of_step_times(tmp_path):
    history = RunHistory.read(write_run(tmp_path / "old", sync_records(with_clock=False)))
    assert not history.wall_clock_logged
    assert history.wall_clock[-1] == 60.0
    assert summarize(history)["trained_tokens_per_s"] == pytest.approx(5 * 1000 / 50)
    # the validation before the first step sits at zero seconds
    _, by_time = history.series(lambda r: r.get(VAL))
    assert by_time[0] == (0.0, 0.2)


def test_a_step_logged_twice_counts_once_and_a_cut_line_is_skipped(tmp_path):
    records = sync_records(steps=3)
    redone = dict(records[2], **{"critic/score/mean": 0.9})
    folder = write_run(tmp_path / "run", [*records, redone], tail='{"step": 4, "crit')
    history = RunHistory.read(folder)
    assert [r["step"] for r in history.records] == [0, 1, 2, 3]
    assert history.records[2]["critic/score/mean"] == 0.9


def test_the_table_has_a_row_per_run_and_dashes_for_missing_metrics(tmp_path):
    write_run(tmp_path / "sync-2dev", sync_records())
    write_run(tmp_path / "async-1-1", async_records())
    table, png = compare_runs(
        [tmp_path / "sync-2dev", tmp_path / "async-1-1"], tmp_path / "out.png"
    )
    lines, verdicts = table.split("\n\n")[0].splitlines(), table.split("\n\n")[1:]
    assert len(lines) == 4  # two header lines, a row per run
    assert len(verdicts) == 1 and verdicts[0].startswith("async-1-1: the trainer is the bottleneck")
    assert lines[0].split()[:2] == ["wall", "trained"]
    assert lines[1].split()[:4] == ["run", "steps", "s", "tok/s"]
    assert lines[1].split()[-2:] == ["first", "last"]
    sync_row, async_row = lines[2].split(), lines[3].split()
    assert sync_row[0] == "sync-2dev" and async_row[0] == "async-1-1"
    assert sync_row.count("-") == 7
    assert "-" not in async_row
    assert "100.0" in sync_row and "250.0" in async_row
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_the_same_folder_name_are_told_apart(tmp_path):
    labels = run_labels([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "c"])
    assert labels == ["a/run", "b/run", "c"]
    assert format_table(["x", "y"], [{}, {"steps": 3}]).splitlines()[1:] == [
        "run  steps",
        "x        -",
        "y        3",
    ]


def test_two_sync_runs_get_a_narrow_table_without_the_fully_async_columns(tmp_path):
    """The columns only a fully-async run fills are left out when no run has them, and the
    table of two sync runs fits in 100 characters."""
    write_run(tmp_path / "quickstart", sync_records())
    write_run(tmp_path / "quickstart-lora", sync_records(seconds_per_step=12.5))
    table, _ = compare_runs([tmp_path / "quickstart", tmp_path / "quickstart-lora"])
    lines = table.splitlines()
    assert len(lines) == 4 and max(map(len, lines)) <= 100, table
    top = ["wall", "trained", "median", "reward", "reward", "val", "acc", "val", "acc"]
    bottom = ["run", "steps", "s", "tok/s", "step", "s", "last", "last5", "first", "last"]
    assert lines[0].split() == top and lines[1].split() == bottom
    assert "-" not in lines[2].split() and "-" not in lines[3].split()


def test_compare_command(tmp_path):
    write_run(tmp_path / "sync", sync_records())
    write_run(tmp_path / "async", async_records())
    out = tmp_path / "both.png"
    result = CliRunner().invoke(
        cli, ["compare", str(tmp_path / "sync"), str(tmp_path / "async"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].startswith("sync ")
    assert out.exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("one", r"^Error: plugrl compare needs two run folders or more, got 1; for one run use "),
        ("missing", r"^Error: .*nothing is not a folder; give plugrl compare run folders$"),
        ("no-metrics", r"^Error: .*metrics.jsonl not found: is .*empty a plugrl run folder"),
        ("no-steps", r"^Error: .*metrics.jsonl has no training step yet \(no perf/total_num"),
        ("empty-file", r"^Error: .*blank/metrics.jsonl has no training step yet"),
        ("twice", r"^Error: .*sync is given twice; give each run folder once$"),
        ("no-folder-for-png", r"^Error: cannot write .*/nowhere/x.png: its folder does not exist"),
    ],
)
def test_compare_errors_are_one_line(tmp_path, setup, message):
    write_run(tmp_path / "sync", sync_records())
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "started", [{"step": 0, VAL: 0.1}])
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "metrics.jsonl").write_text("")
    runs = {
        "one": ["sync"],
        "missing": ["sync", "nothing"],
        "no-metrics": ["sync", "empty"],
        "no-steps": ["sync", "started"],
        "empty-file": ["sync", "blank"],
        "twice": ["sync", "sync"],
        "no-folder-for-png": ["sync", "async"],
    }[setup]
    write_run(tmp_path / "async", async_records())
    out = tmp_path / ("nowhere" if setup == "no-folder-for-png" else "") / "x.png"
    result = CliRunner().invoke(
        cli, ["compare", *(str(tmp_path / run) for run in runs), "-o", str(out)]
    )
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert re.search(message, result.stderr.strip()), result.stderr
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(PlugrlError):
        compare_runs([tmp_path / run for run in runs], out if "png" in setup else None)


def async_summary(trainer_idle, paused, **extra):
    return {
        "trainer_idle": trainer_idle,
        "rollouter_paused": paused,
        "rollouter_idle": 0.4,
        "old_log_prob_share": None,
        "dropped_samples": 0.0,
        "generated_samples": 100.0,
        "lag_bound": 2.0,
        **extra,
    }


@pytest.mark.parametrize(
    ("trainer_idle", "paused", "verdict", "key"),
    [
        (0.05, 0.9, "the trainer is the bottleneck", "trainer.n_gpus_per_node"),
        (0.4, 0.9, "the staleness bound holds generation back", "staleness_threshold"),
        (0.4, 0.1, "generation is the bottleneck", "rollout.n_gpus_per_node"),
    ],
)
def test_a_fully_async_run_is_told_what_held_it_back(trainer_idle, paused, verdict, key):
    (line,) = diagnose(async_summary(trainer_idle, paused))
    assert line.startswith(verdict) and key in line


def test_the_old_log_prob_pass_is_named_only_when_it_costs_the_trainer():
    (costly,) = diagnose(async_summary(0.05, 0.9, old_log_prob_share=0.2))
    assert "use_rollout_log_probs: true" in costly and "20%" in costly
    (cheap,) = diagnose(async_summary(0.05, 0.9, old_log_prob_share=0.01))
    assert "use_rollout_log_probs" not in cheap


def test_many_dropped_samples_get_a_line_with_the_bound():
    lines = diagnose(async_summary(0.4, 0.9, dropped_samples=12.0))
    assert len(lines) == 2
    assert "12 of 100 generated samples (12%)" in lines[1] and "2 weight versions" in lines[1]
    assert len(diagnose(async_summary(0.4, 0.9, dropped_samples=2.0))) == 1


def test_compare_prints_a_verdict_for_async_runs_only(tmp_path):
    sync = write_run(tmp_path / "sync", sync_records())
    records = async_records()
    for record in records:
        record["fully_async/rollouter/paused_ratio"] = 0.8
        record["fully_async/count/total_generated_samples"] = 100
    run = write_run(tmp_path / "async", records)
    table, _ = compare_runs([sync, run], out=None)
    notes = [line for line in table.splitlines() if ": " in line and "bottleneck" in line]
    # the async run's trainer waited 10%: trainer-bound; its 5 dropped of 100 get a line too
    assert [line.split(":")[0] for line in notes] == ["async"]
    assert any(line.startswith("async: 5 of 100 generated samples") for line in table.splitlines())
    assert not any(line.startswith("sync:") for line in table.splitlines())


def test_advice_fits_the_cluster_mode_the_run_folder_recorded(tmp_path):
    from plugrl.recipe import build_recipe

    sync = write_run(tmp_path / "sync", sync_records())
    local = write_run(tmp_path / "local", async_records())
    (local / "recipe.yaml").write_text(build_recipe({}, get_plugin_manager()).to_yaml())
    on_ray = write_run(tmp_path / "ray", async_records())
    (on_ray / "recipe.yaml").write_text(
        build_recipe({"cluster": "ray"}, get_plugin_manager()).to_yaml()
    )
    assert RunHistory.read(local).cluster_mode == "local"
    assert RunHistory.read(sync).cluster_mode is None  # no recipe recorded
    table, _ = compare_runs([sync, local, on_ray])
    notes = {line.split(":")[0]: line for line in table.splitlines() if "bottleneck" in line}
    assert notes["local"] == (
        "local: the trainer is the bottleneck: the trainer waited for samples 10% of the time "
        "and the engines had nothing to do 40%; it trained in one process (cluster.mode=local): "
        "run it on Ray to give the trainer devices of its own (cluster.mode=ray with "
        "trainer.n_gpus_per_node and rollout.n_gpus_per_node); a higher staleness_threshold "
        "will not help"
    )
    assert notes["ray"] == (
        "ray: the trainer is the bottleneck: the trainer waited for samples 10% of the time "
        "and the engines had nothing to do 40%; give the trainer more devices "
        "(trainer.n_gpus_per_node) and the engines fewer (rollout.n_gpus_per_node); a higher "
        "staleness_threshold will not help"
    )


def test_generation_bound_advice_for_a_run_in_one_process():
    (line,) = diagnose(async_summary(0.4, 0.1), cluster_mode="local")
    assert line == (
        "generation is the bottleneck: the trainer waited for samples 40% of the time and the "
        "staleness bound seldom stopped the rollouter; raise scheduler.max_in_flight_per_engine, "
        "or run on Ray to give the engines devices of their own (cluster.mode=ray with "
        "rollout.n_gpus_per_node)"
    )


def test_compare_writes_a_png_only_when_asked(tmp_path, monkeypatch):
    write_run(tmp_path / "sync", sync_records())
    write_run(tmp_path / "async", async_records())
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    runs = [str(tmp_path / "sync"), str(tmp_path / "async")]
    result = CliRunner().invoke(cli, ["compare", *runs])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert list(work.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["metrics.jsonl"]
    result = CliRunner().invoke(cli, ["compare", *runs, "-o", "both.png"])
    assert result.exit_code == 0, result.output
    assert result.stderr == "plot: both.png\n"
    assert [p.name for p in work.iterdir()] == ["both.png"]


def test_staleness_0_with_sync_step_1_is_called_one_step_off_policy(tmp_path):
    from plugrl.recipe import build_recipe

    def async_run(name, **scheduler):
        folder = write_run(tmp_path / name, async_records())
        recipe = build_recipe(
            {"scheduler": {"name": "fully_async", **scheduler}, "rollout": {"colocate": False}},
            get_plugin_manager(),
        )
        (folder / "recipe.yaml").write_text(recipe.to_yaml())
        return folder

    sync = write_run(tmp_path / "sync", sync_records())
    (sync / "recipe.yaml").write_text(build_recipe({}, get_plugin_manager()).to_yaml())
    zero = async_run("zero", staleness_threshold=0, trigger_parameter_sync_step=1)
    ahead = async_run("ahead", staleness_threshold=0.5)
    every_two = async_run("every-two", staleness_threshold=0, trigger_parameter_sync_step=2)
    table, _ = compare_runs([sync, zero, ahead, every_two])
    notes = [line for line in table.splitlines() if "off-policy" in line]
    assert notes == [
        "zero: staleness_threshold 0 with trigger_parameter_sync_step 1 is one-step off-policy, "
        "not sync: the engines generate the next step's samples while the trainer trains, with "
        "weights a version behind (largest lag seen: 2); for on-policy training compare with "
        "scheduler: sync"
    ]
