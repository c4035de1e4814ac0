"""A GRPO run that trains LoRA adapters with a KL loss: the reference log-probs come from the
actor with its adapters off (no reference model), and the export holds the merged model and
the adapter folder."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow


def test_a_lora_run_with_a_kl_loss_exports_merged_weights_and_the_adapter(tiny_task, tmp_path):
    recipe = tiny_recipe(
        tiny_task,
        tmp_path / "run",
        model={"lora_rank": 8, "lora_alpha": 16},
        actor={"ppo_mini_batch_size": 4, "use_kl_loss": True, "optim": {"lr": 1e-2}},
        trainer={"export_hf": True},
    )
    result = CliRunner().invoke(cli, ["run", str(write_recipe(tmp_path / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    steps = by_step(read_records(tmp_path / "run"))
    # step 1 updates from the model it started from: the policy is the reference exactly
    assert steps[1]["actor/kl_loss"] == 0.0
    assert steps[2]["actor/kl_loss"] > 0.0
    assert "timing_s/ref" in steps[2]
    exported = tmp_path / "run" / "hf_model"
    assert (exported / "model.safetensors").is_file()
    assert (exported / "lora_adapter" / "adapter_model.safetensors").is_file()
