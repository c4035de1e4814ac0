"""The accelerator smoke script, run here on the cpu device so that it stays correct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from plugrl_cuda import smoke

pytestmark = pytest.mark.slow


def test_the_smoke_script_passes_on_cpu(tmp_path, monkeypatch, capsys, tiny_task):
    # one rank: two Ray ranks training like one is tests/e2e/test_grpo_run.py's
    # test_two_ray_ranks_and_an_engine_of_its_own_train_like_one_local_rank; the script's
    # comparison is tested below
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the task the script builds is the session's tiny_task (the same builder and arguments,
    # built once for every test); the script only reads it
    monkeypatch.setattr(smoke, "build_untrained_task", lambda root: tiny_task)
    assert smoke.main(["--device", "cpu", "--ranks", "1", "--workdir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in {"PASS", "FAIL"}]
    assert [line.split(":")[0] for line in lines] == [
        "PASS device",
        "PASS three steps on one rank",
        "PASS resume with param offload",
    ]


def _runs_writing_metrics(monkeypatch, ray_gap):
    """``smoke.run_plugrl`` replaced by one that writes two steps of metrics to the recipe's
    run folder, those of a Ray recipe off by ``ray_gap`` (relative); returns the recipes run."""
    ran = []

    def run_plugrl(recipe, *overrides):
        data = yaml.safe_load(recipe.read_text())
        ran.append((data, overrides))
        scale = 1 + ray_gap if data.get("cluster") == "ray" else 1
        run_dir = data["trainer"]["default_local_dir"]
        steps = [{"step": step, **GOOD_STEP} for step in (1, 2)]
        for record in steps:
            record.update({name: record[name] * scale for name in smoke.CHECKED_METRICS})
        _write_metrics(Path(run_dir), *steps)
        return ""

    monkeypatch.setattr(smoke, "run_plugrl", run_plugrl)
    return ran


def _smoke_of_two_ranks(tmp_path):
    from plugrl_tools.quickstart.untrained import UntrainedTask

    check = smoke.Smoke("cpu", 2, tmp_path)
    check.task = UntrainedTask(
        root=tmp_path / "task",
        model=tmp_path / "task" / "model",
        train_file=tmp_path / "task" / "train.parquet",
        val_file=tmp_path / "task" / "val.parquet",
    )
    return check


def test_the_rank_check_runs_two_steps_on_one_rank_and_on_ray_ranks(tmp_path, monkeypatch):
    ran = _runs_writing_metrics(monkeypatch, ray_gap=smoke.RANK_TOLERANCE / 2)
    assert _smoke_of_two_ranks(tmp_path).ranks_match().startswith("largest relative gap 5.0e-04")
    (local, local_overrides), (ray, ray_overrides) = ran
    assert local.get("cluster") != "ray" and local["trainer"].get("n_gpus_per_node", 1) == 1
    assert ray["cluster"] == "ray" and ray["trainer"]["n_gpus_per_node"] == 2
    assert (
        local_overrides
        == ray_overrides
        == (
            "trainer.total_training_steps=2",
            "trainer.save_freq=0",
        )
    )


def test_the_rank_check_fails_on_a_gap_over_its_tolerance(tmp_path, monkeypatch):
    _runs_writing_metrics(monkeypatch, ray_gap=smoke.RANK_TOLERANCE * 2)
    failure = r"step 1 actor/pg_loss: one rank 0\.1, 2 ranks 0\.1002"
    with pytest.raises(smoke.SmokeFailure, match=failure):
        _smoke_of_two_ranks(tmp_path).ranks_match()


def test_a_failing_check_is_reported_and_fails_the_script(tmp_path, capsys):
    # more ranks than this machine has CPUs: the device check fails and nothing runs
    assert smoke.main(["--device", "cpu", "--ranks", "4096", "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL device: --ranks 4096 but" in out
    assert not (tmp_path / "task").exists()


def _write_metrics(run_dir, *records):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record) for record in records]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


GOOD_STEP = {
    "actor/pg_loss": 0.1,
    "actor/grad_norm": 0.5,
    "actor/kl_loss": 0.01,
    "critic/score/mean": 0.4,
    "perf/cpu_memory_used_gb": 1.0,
}


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"step": 1, **GOOD_STEP}], "no metrics for step 2 in "),
        (
            [{"step": 1, **GOOD_STEP}, {"step": 2, **GOOD_STEP, "actor/grad_norm": 0.0}],
            "step 2: no gradient (actor/grad_norm is 0)",
        ),
        (
            [{"step": 1, **GOOD_STEP}, {"step": 2, **GOOD_STEP, "actor/kl_loss": "nan"}],
            "step 2: actor/kl_loss is 'nan'",
        ),
        (
            [{"step": 1, **GOOD_STEP}, {"step": 2, **GOOD_STEP, "perf/cpu_memory_used_gb": 0}],
            "step 2: no perf/cpu_memory_used_gb",
        ),
        (
            [{"step": 1, **GOOD_STEP}, {"step": 1, **GOOD_STEP}],
            "step 1 was logged twice in ",
        ),
    ],
    ids=["missing-step", "no-gradient", "not-finite", "no-memory", "twice"],
)
def test_check_steps_names_what_is_wrong(tmp_path, records, message):
    _write_metrics(tmp_path, *records)
    with pytest.raises(smoke.SmokeFailure) as info:
        smoke.check_steps(tmp_path, range(1, 3), "perf/cpu_memory_used_gb")
    assert str(info.value).startswith(message)


def test_check_steps_accepts_good_steps(tmp_path):
    _write_metrics(tmp_path, {"step": 1, **GOOD_STEP}, {"step": 2, **GOOD_STEP})
    smoke.check_steps(tmp_path, range(1, 3), "perf/cpu_memory_used_gb")
