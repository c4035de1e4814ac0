"""The NPU smoke script's argument handling and failure lines (it needs Ascend NPUs to pass,
which this machine lacks)."""

from __future__ import annotations

import pytest

from plugrl_npu import smoke
from tests.plugins.devices.npu import fake_ascend

GOOD_STEP = {
    "actor/pg_loss": 0.1,
    "actor/grad_norm": 0.5,
    "critic/score/mean": 0.4,
    "response_length/mean": 12.0,
    "perf/max_memory_allocated_gb": 2.5,
    "perf/time_per_step": 3.0,
}


def test_without_torch_npu_it_fails_first_and_builds_nothing(tmp_path, capsys):
    assert smoke.main(["--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL npu: torch_npu is not installed: pip install torch-npu matching" in out
    assert "PASS" not in out
    assert list(tmp_path.iterdir()) == []


def test_without_npus_it_says_so(tmp_path, monkeypatch, capsys):
    fake_ascend.install_torch_npu(monkeypatch, count=0)
    assert smoke.main(["--workdir", str(tmp_path)]) == 1
    assert "FAIL npu: torch_npu sees no NPU" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        smoke.main(["--backend", "deepspeed"])
    assert exited.value.code == 2
    assert "invalid choice: 'deepspeed'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        smoke.main(["--steps", "-1"])
    assert "--steps must be at least 1, got -1" in capsys.readouterr().err


def test_step_checks_print_figures_and_catch_bad_steps():
    lines = smoke.check_steps([{"step": 1, **GOOD_STEP}], 1)
    assert lines == [
        "step 1: score 0.400, pg_loss +0.1000, grad_norm 0.5000, max memory 2.50 GiB, 3.00 s/step"
    ]
    with pytest.raises(smoke.SmokeFailure, match="perf/max_memory_allocated_gb is 0"):
        smoke.check_steps([{"step": 1, **GOOD_STEP, "perf/max_memory_allocated_gb": 0.0}], 1)
    with pytest.raises(smoke.SmokeFailure, match="no metrics for step 2"):
        smoke.check_steps([{"step": 1, **GOOD_STEP}], 2)


def test_the_patch_lines_must_be_in_the_log():
    stderr = (
        "INFO prepare_backend(npu, fsdp2) by npu: transformers Qwen2: RMSNorm -> npu_rms_norm, "
        "MLP -> npu_swiglu, rotary -> npu_rotary_mul\n"
    )
    assert smoke.check_patch_log(stderr, "fsdp2") == "1 patch line(s) logged"
    with pytest.raises(smoke.SmokeFailure, match=r"lacks .*mindspeed.*seen: INFO prepare_backend"):
        smoke.check_patch_log(stderr, "megatron")
    with pytest.raises(smoke.SmokeFailure, match="no prepare_backend line at all"):
        smoke.check_patch_log("", "fsdp2")
