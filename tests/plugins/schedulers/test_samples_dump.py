"""The samples dump of whole runs (``trainer.rollout_data_dir``, ``validation_data_dir``) on
the simulated parts, for both schedulers: the core writes it whatever the scheduler."""

from __future__ import annotations

import json

import pytest

import plugrl_sim
from plugrl.run.runner import run_recipe
from plugrl_sim.parts import sim_recipe

LINE_KEYS = {"prompt", "response", "score", "ground_truth", "data_source", "step", "acc"}


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("scheduler", ["sync", "fully_async"])
def test_each_step_and_validation_writes_its_samples(
    scheduler,
    sim_task,
    tmp_path,
    monkeypatch,
    plugrl_recipe,
    plugrl_register_plugin,
    plugrl_plugin_manager,
):
    plugrl_register_plugin(plugrl_sim, "plugrl-sim")
    monkeypatch.chdir(tmp_path)  # relative folders start at the working folder
    data = sim_recipe(
        sim_task,
        tmp_path / "run",
        scheduler=scheduler,
        colocate=scheduler == "sync",
        max_response_length=16,
        train_batch_size=4,
        n=2,
        steps=2,
    )
    data["trainer"].update(
        rollout_data_dir="rollouts",
        validation_data_dir=str(tmp_path / "validations"),
        val_before_train=True,
        test_freq=1,
    )
    run_recipe(plugrl_recipe(data), plugrl_plugin_manager)

    rollouts = tmp_path / "rollouts"
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl"]
    for step in (1, 2):
        rows = lines(rollouts / f"{step}.jsonl")
        assert len(rows) == 4 * 2  # every response the step trained on
        for row in rows:
            assert set(row) == LINE_KEYS
            assert row["step"] == step and row["data_source"] == "plugrl/sim"
            assert row["ground_truth"] in ("0", "1")
            # the sim scorer: 1 when the response's length has the ground truth's parity
            correct = len(row["response"]) % 2 == int(row["ground_truth"])
            assert row["score"] == row["acc"] == float(correct)
            assert row["prompt"]
    validations = tmp_path / "validations"
    assert sorted(p.name for p in validations.iterdir()) == [
        "val_0.jsonl",
        "val_1.jsonl",
        "val_2.jsonl",
    ]
    rows = lines(validations / "val_2.jsonl")
    assert len(rows) == 4  # the validation prompts, one response each
    assert {row["step"] for row in rows} == {2} and set(rows[0]) == LINE_KEYS


def test_off_by_default(
    sim_task, tmp_path, monkeypatch, plugrl_recipe, plugrl_register_plugin, plugrl_plugin_manager
):
    plugrl_register_plugin(plugrl_sim, "plugrl-sim")
    monkeypatch.chdir(tmp_path)
    data = sim_recipe(
        sim_task, tmp_path / "run", max_response_length=16, train_batch_size=4, n=2, steps=1
    )
    run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
