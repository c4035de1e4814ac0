"""Learning-health checks in real runs of the tiny model: each run is built to show one
problem, and the check that watches for it fires into the logged metrics and the log."""

from __future__ import annotations

import pytest

from tests.e2e.e2e_support import (
    by_step,
    check_ok,
    read_records,
    run_cli,
    tiny_recipe,
    write_recipe,
)

pytestmark = pytest.mark.slow


def fired(run_dir) -> dict[str, list[int]]:
    checks: dict[str, list[int]] = {}
    for step, record in sorted(by_step(read_records(run_dir)).items()):
        for key in record:
            if key.startswith("health/"):
                checks.setdefault(key[len("health/") :], []).append(step)
    return checks


def test_near_greedy_sampling_trips_entropy_collapse(tiny_task, tmp_path):
    # sampling at temperature 0.001 is the distribution of a collapsed policy: the trainer's
    # entropy is that of the logits divided by the same temperature
    recipe = tiny_recipe(
        tiny_task,
        tmp_path / "run",
        rollout={"n": 2, "temperature": 0.001},
        trainer={
            "total_training_steps": 3,
            "health": {
                "checks": ["entropy_collapse"],
                "check_args": {"entropy_collapse": {"patience": 2}},
            },
        },
    )
    result = check_ok(run_cli(write_recipe(tmp_path / "recipe.yaml", recipe)))
    records = by_step(read_records(tmp_path / "run"))
    assert all(records[step]["actor/entropy"] < 1e-3 for step in (1, 2, 3))
    assert fired(tmp_path / "run") == {"entropy_collapse": [2]}
    assert "health check 'entropy_collapse': actor/entropy = " in result.stderr
