"""A run through the CLI whose reward is two weighted components (verl #2889's use case: a
correctness scorer plus a format bonus), each logged on its own every step."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.tools.test_cli import plugrl

FORMAT = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    short = len(solution_str) < 8
    return {"score": 1.0 if short else 0.0, "short": short}
"""


@pytest.mark.slow
def test_a_run_with_two_weighted_components_logs_each_every_step(tmp_path, sim_task):
    from plugrl_sim.parts import sim_recipe

    (tmp_path / "format.py").write_text(FORMAT, encoding="utf-8")
    run_dir = tmp_path / "run"
    data = sim_recipe(sim_task, run_dir, max_response_length=16, train_batch_size=4, n=2, steps=5)
    data["reward"] = {
        "components": {
            "correct": {"weight": 1.0},
            "format": {"weight": 0.5, "custom_function": {"path": "format.py"}},
        }
    }
    data["trainer"]["rollout_data_dir"] = "rollouts"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = plugrl("run", str(recipe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 5
    for metrics in steps:
        correct, short = metrics["reward/correct/mean"], metrics["reward/format/mean"]
        assert metrics["critic/score/mean"] == pytest.approx(correct + 0.5 * short)
        assert "reward/format/latency_s" in metrics and metrics["reward/errors"] == 0
    rows = [
        json.loads(line) for line in (tmp_path / "rollouts" / "5.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 8
    for row in rows:
        assert row["score"] == pytest.approx(row["correct_score"] + 0.5 * row["format_score"])
        assert row["format/short"] == (len(row["response"]) < 8)
        assert row["acc"] == row["correct_score"]  # the sim scorer's acc, unprefixed
