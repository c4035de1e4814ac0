"""A bfloat16 rollout beside a float32 trainer (the colocated engine's own copy of the fsdp2
module's weights): ``algorithm.rollout_is`` sees and corrects the gap, which float32 closes."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow

IS_MEAN = "rollout_corr/rollout_is_mean"


def _run(task, folder, dtype):
    recipe = tiny_recipe(
        task,
        folder / "run",
        rollout={"n": 2, "dtype": dtype},
        algorithm={"adv_estimator": "grpo", "rollout_is": "token"},
    )
    recipe_file = write_recipe(folder / "recipe.yaml", recipe)
    result = CliRunner().invoke(cli, ["run", str(recipe_file)])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    return by_step(read_records(folder / "run"))


def test_rollout_is_weighs_a_bfloat16_rollout_and_float32_needs_no_weights(tiny_task, tmp_path):
    bf16 = _run(tiny_task, tmp_path / "bf16", "bfloat16")
    fp32 = _run(tiny_task, tmp_path / "fp32", "float32")
    for step in (1, 2):
        # float32: the engine's log-probs are the trainer's, every weight is 1
        assert fp32[step][IS_MEAN] == pytest.approx(1.0, abs=1e-4)
        # bfloat16: near 1, not 1 (the logged figure is the mean weight); the update runs on
        bf16_mean = bf16[step][IS_MEAN]
        assert bf16_mean == pytest.approx(1.0, abs=0.1)
        assert abs(bf16_mean - 1.0) > 1e-4, bf16_mean
        assert math.isfinite(bf16[step]["actor/pg_loss"])
