"""An exactly on-policy step (one optimizer step per batch) skips the old-log-prob pass and
trains as the step that runs it does."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import (
    assert_same_metrics,
    by_step,
    read_records,
    tiny_recipe,
    write_recipe,
)

pytestmark = pytest.mark.slow


def _run(task, folder, *overrides):
    recipe = tiny_recipe(task, folder / "run", actor={"ppo_mini_batch_size": 4})
    recipe_file = write_recipe(folder / "recipe.yaml", recipe)
    result = CliRunner().invoke(cli, ["run", str(recipe_file), *overrides])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    return by_step(read_records(folder / "run"))


def test_the_skipped_pass_changes_nothing_but_the_time(tiny_task, tmp_path):
    derived = _run(tiny_task, tmp_path / "derived")
    recomputed = _run(tiny_task, tmp_path / "recomputed", "actor.reuse_on_policy_log_prob=false")
    assert sorted(derived) == sorted(recomputed) == [0, 1, 2]  # 0: validation
    for step in (1, 2):
        assert "timing_s/old_log_prob" not in derived[step]
        assert "timing_s/old_log_prob" in recomputed[step]
        assert derived[step]["actor/ppo_kl"] == 0.0
        assert abs(recomputed[step]["actor/ppo_kl"]) < 1e-6
        assert derived[step]["actor/entropy"] > 0
        # the update's forward compares the engine with the trainer by the mean only (the
        # separate pass also logs the max, the spread and the correlation)
        pass_only = {
            name: value
            for name, value in recomputed[step].items()
            if name.startswith("training/rollout_") and name != "training/rollout_probs_diff_mean"
        }
        assert len(pass_only) == 4
        recomputed_shared = {k: v for k, v in recomputed[step].items() if k not in pass_only}
        # the same samples, rewards, advantages, losses and entropy, step after step
        assert_same_metrics(
            derived[step], recomputed_shared, rel=1e-4, abs_=1e-6, where=f"step {step}"
        )
