"""``trainer.full_determinism`` on a tiny-model GRPO run: the same seed twice gives the same
run, bit for bit (every metric of every step, and every exported weight)."""

from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import MACHINE_METRICS, by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow


@pytest.fixture
def restored_process():
    """The runs switch this process to deterministic algorithms and set the device's
    variables: both go back afterwards, for the tests that follow in this process."""
    env = dict(os.environ)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    os.environ.clear()
    os.environ.update(env)
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def deterministic_run(task, folder):
    recipe = tiny_recipe(
        task,
        folder / "run",
        trainer={"full_determinism": True, "export_hf": True, "seed": 7},
    )
    result = CliRunner().invoke(cli, ["run", str(write_recipe(folder / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    assert torch.are_deterministic_algorithms_enabled()  # the run went through the option
    steps = by_step(read_records(folder / "run"))
    metrics = {
        step: {k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)}
        for step, record in steps.items()
    }
    from safetensors.torch import load_file

    return metrics, load_file(str(folder / "run" / "hf_model" / "model.safetensors"))


def test_two_runs_with_the_same_seed_are_the_same_bit_for_bit(
    tiny_task, tmp_path, restored_process
):
    first_metrics, first_weights = deterministic_run(tiny_task, tmp_path / "first")
    second_metrics, second_weights = deterministic_run(tiny_task, tmp_path / "second")
    assert sorted(first_metrics) == [0, 1, 2]  # validation before training, two steps
    assert sorted(second_metrics) == sorted(first_metrics)
    different = {
        (step, key): (first_metrics[step].get(key), record.get(key))
        for step, record in second_metrics.items()
        for key in set(record) | set(first_metrics[step])
        if record.get(key) != first_metrics[step].get(key)
    }
    assert not different  # exact: floats compared as they were logged
    assert sorted(second_weights) == sorted(first_weights)
    for name, weight in first_weights.items():
        assert torch.equal(second_weights[name], weight), name
    # the runs trained: the weights moved from the model they started from
    assert first_metrics[1]["actor/grad_norm"] > 0
