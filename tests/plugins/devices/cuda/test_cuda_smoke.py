"""The accelerator smoke script, run here on the cpu device so that it stays correct."""

from __future__ import annotations

import json

import pytest

from plugrl_cuda import smoke

pytestmark = pytest.mark.slow


def test_the_smoke_script_passes_on_cpu_with_two_ray_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert smoke.main(["--device", "cpu", "--ranks", "2", "--workdir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in {"PASS", "FAIL"}]
    assert [line.split(":")[0] for line in lines] == [
        "PASS device",
        "PASS three steps on one rank",
        "PASS resume",
        "PASS param offload",
        "PASS 2 ranks under Ray match one rank",
    ]


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
