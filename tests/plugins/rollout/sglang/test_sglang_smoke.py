"""The SGLang smoke script's argument handling and failure lines (it needs SGLang and an
accelerator to pass, which this machine lacks)."""

from __future__ import annotations

import pytest

from plugrl_sglang import smoke
from tests import install_hints as hints
from tests.plugins.rollout.sglang import fake_sglang

GOOD_STEP = {
    "actor/pg_loss": 0.1,
    "actor/grad_norm": 0.5,
    "critic/score/mean": 0.4,
    "response_length/mean": 12.0,
    "perf/weight_sync_megabytes": 16.0,
    "perf/weight_sync_megabytes_per_s": 800.0,
    "timing_s/gen": 1.5,
    "perf/throughput": 2000.0,
}


def test_without_sglang_it_fails_first_and_builds_nothing(tmp_path, capsys):
    assert smoke.main(["--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL sglang: SGLang is not installed: {hints.SGLANG}" in out
    assert "PASS" not in out
    assert list(tmp_path.iterdir()) == []


def test_without_an_accelerator_it_fails_at_the_device(tmp_path, monkeypatch, capsys):
    fake_sglang.install(monkeypatch)
    assert smoke.main(["--workdir", str(tmp_path), "--device", "cpu"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "PASS sglang: SGLang 0.5.5"
    assert out[2] == "FAIL device: no accelerator found (device 'cpu'); SGLang needs one"
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_device_is_named(tmp_path, monkeypatch, capsys):
    fake_sglang.install(monkeypatch)
    assert smoke.main(["--workdir", str(tmp_path), "--device", "tpu"]) == 1
    assert "FAIL device: no device plugin 'tpu' is installed" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        smoke.main(["--steps", "0"])
    assert exited.value.code == 2
    assert "--steps must be at least 1, got 0" in capsys.readouterr().err


def test_step_checks_print_figures_and_catch_bad_steps():
    records = [{"step": 1, **GOOD_STEP}, {"step": 2, **GOOD_STEP}]
    lines = smoke.check_steps(records, 2)
    assert lines[1] == (
        "step 2: score 0.400, pg_loss +0.1000, response length 12.0, generation 1.50 s, "
        "throughput 2000 tokens/s, weight push 800 MB/s"
    )
    with pytest.raises(smoke.SmokeFailure, match="no metrics for step 3"):
        smoke.check_steps(records, 3)
    for change, message in [
        ({"actor/pg_loss": "nan"}, "step 1: actor/pg_loss is 'nan'"),
        ({"actor/grad_norm": 0.0}, "step 1: no gradient"),
        ({"response_length/mean": 0.0}, "step 1: the engine sampled empty responses"),
        ({"perf/weight_sync_megabytes": 0.0}, "step 1: no weights were pushed to the engine"),
    ]:
        with pytest.raises(smoke.SmokeFailure, match=message):
            smoke.check_steps([{"step": 1, **GOOD_STEP, **change}], 1)
