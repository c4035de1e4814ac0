"""The smoke scripts' harness (plugrl_tools.smoke), without a run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from plugrl_tools import smoke
from plugrl_tools.quickstart.untrained import UntrainedTask

GOOD = {"step": 1, "actor/pg_loss": 0.1, "actor/grad_norm": 0.5}


def test_check_prints_one_line_and_says_whether_it_passed(capsys):
    assert smoke.check("device", lambda: "2 device(s)")
    assert smoke.check("quiet", lambda: "")

    def failing() -> str:
        raise smoke.SmokeFailure("no device")

    assert not smoke.check("device", failing)
    assert capsys.readouterr().out.splitlines() == [
        "PASS device: 2 device(s)",
        "PASS quiet",
        "FAIL device: no device",
    ]


def test_a_bug_in_a_check_is_not_a_failed_check():
    with pytest.raises(ZeroDivisionError):
        smoke.check("bug", lambda: str(1 / 0))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (None, "no metrics for step 1 in RUN"),
        ({**GOOD, "actor/pg_loss": "nan"}, "step 1: actor/pg_loss is 'nan'"),
        ({**GOOD, "actor/pg_loss": float("inf")}, "step 1: actor/pg_loss is inf"),
        ({"step": 1, "actor/grad_norm": 0.5}, "step 1: actor/pg_loss is None"),
        ({**GOOD, "actor/grad_norm": 0.0}, "step 1: no gradient (actor/grad_norm is 0)"),
        # a norm that is not a number is named as such, not as a missing gradient
        ({**GOOD, "actor/grad_norm": float("nan")}, "step 1: actor/grad_norm is nan"),
    ],
)
def test_check_step_names_what_is_wrong(record, message):
    with pytest.raises(smoke.SmokeFailure) as info:
        smoke.check_step(record, 1, ("actor/pg_loss", "actor/grad_norm"), where=" in RUN")
    assert str(info.value).startswith(message)


def test_each_step_in_order_with_the_last_record_of_a_step():
    records = [{**GOOD, "step": 2}, GOOD, {**GOOD, "step": 2, "actor/pg_loss": 0.2}]
    got = list(smoke.each_step(records, [1, 2], ["actor/pg_loss"]))
    assert [(step, record["actor/pg_loss"]) for step, record in got] == [(1, 0.1), (2, 0.2)]
    with pytest.raises(smoke.SmokeFailure, match="no metrics for step 3"):
        list(smoke.each_step(records, [1, 3], ["actor/pg_loss"]))


def test_grpo_recipe_merges_the_sections_given():
    task = UntrainedTask(
        root=Path("t"), model=Path("t/m"), train_file=Path("t/a"), val_file=Path("t/b")
    )
    recipe = smoke.grpo_recipe(
        task, "cpu", Path("run"), model={"dtype": "bfloat16"}, cluster="ray", extra=[1]
    )
    assert recipe["model"] == {"path": str(Path("t/m")), "dtype": "bfloat16"}
    assert recipe["cluster"] == "ray" and recipe["extra"] == [1]
    assert recipe["trainer"]["default_local_dir"] == "run"
    assert recipe["actor"]["use_kl_loss"] is True and recipe["algorithm"]["adv_estimator"] == "grpo"
    base = {"trainer": {"seed": 1}}
    assert smoke.merge_sections(base, {"trainer": {"save_freq": 1}}) == {
        "trainer": {"seed": 1, "save_freq": 1}
    }
    assert base == {"trainer": {"seed": 1}}


def test_run_plugrl_reports_a_failed_or_slow_run(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: {path: nowhere}\nno_such_section: {}\n")
    with pytest.raises(smoke.SmokeFailure, match=r"^plugrl run exited 1: .*no_such_section"):
        smoke.run_plugrl(recipe)
    with pytest.raises(smoke.SmokeFailure, match=r"^plugrl run recipe\.yaml took over 0 s$"):
        smoke.run_plugrl(recipe, timeout=0.01)


def test_run_quickstart_runs_a_short_quickstart_that_writes_only_metrics(tmp_path, monkeypatch):
    import plugrl_tools.quickstart

    paths = SimpleNamespace(
        model_path="M",
        train_file="T",
        val_file="V",
        manifest={"settings": {"max_prompt_length": 8, "max_response_length": 4}},
    )
    monkeypatch.setattr(plugrl_tools.quickstart, "prepare_quickstart", lambda root: paths)
    seen = {}

    def fake_run(command, **kwargs):
        seen.update(command=command, cwd=kwargs["cwd"], timeout=kwargs["timeout"])
        return subprocess.CompletedProcess(command, 0, "", "the log")

    monkeypatch.setattr(subprocess, "run", fake_run)
    run_dir = tmp_path / "run"
    stderr = smoke.run_quickstart(tmp_path, run_dir, 3, "device.name=npu", timeout=60)
    assert stderr == "the log"
    assert (seen["cwd"], seen["timeout"]) == (tmp_path, 60)
    assert seen["command"][2:5] == ["plugrl_tools.cli", "run", "quickstart"]
    overrides = seen["command"][5:]
    assert overrides[0] == "model.path=M"
    assert overrides.index("device.name=npu") < overrides.index("trainer.total_training_steps=3")
    for override in (
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.export_hf=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ):
        assert override in overrides


def test_parse_run_arguments_adds_a_short_runs_arguments(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="hf")
    args, workdir = smoke.parse_run_arguments(
        parser, ["--workdir", str(tmp_path / "w"), "--engine", "x"], prefix="p-"
    )
    assert (args.engine, args.steps, args.timeout) == ("x", 2, 1800)
    assert workdir == tmp_path / "w" and workdir.is_dir()
    with pytest.raises(SystemExit):
        smoke.parse_run_arguments(argparse.ArgumentParser(), ["--steps", "0"], prefix="p-")
    assert "--steps must be at least 1, got 0" in capsys.readouterr().err
