"""A GRPO run of the tiny quickstart task through ``plugrl run`` with ``actor.backend:
megatron``: the hook's patches logged, a KL loss against a megatron reference model, weights
pushed to the hf engine, checkpoints, the export, and a resume; with every offload switch on,
so each of those phases finds its state parked and brings it back (the unit tests show the
numbers do not change with them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from tests.e2e.e2e_support import (
    REFERENCE_OVERRIDES,
    REFERENCE_SECTIONS,
    REFERENCE_STEPS,
    by_step,
    check_ok,
    read_records,
    run_cli,
    tiny_recipe,
    write_recipe,
)

pytestmark = pytest.mark.slow


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_grpo_run_with_the_megatron_backend_trains_exports_and_resumes(tiny_task, tmp_path):
    task = tiny_task
    sections = {
        **REFERENCE_SECTIONS,
        "actor": {
            **REFERENCE_SECTIONS["actor"],
            "backend": "megatron",
            "param_offload": True,
            "grad_offload": True,
            "optimizer_offload": True,
            "ref_param_offload": True,
        },
    }
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(task, tmp_path / "run", **sections))
    result = check_ok(run_cli(recipe, *REFERENCE_OVERRIDES))
    assert "prepare_backend(cpu, megatron) by megatron: torch.cuda.current_device -> cpu" in (
        result.stderr
    )
    records = by_step(read_records(tmp_path / "run"))
    assert sorted(records) == list(range(REFERENCE_STEPS + 1))
    for step in range(1, REFERENCE_STEPS + 1):
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
            assert name in records[step], (step, name)
        assert records[step]["actor/grad_norm"] > 0
    exported = weights(tmp_path / "run" / "hf_model")
    initial = weights(task.model)
    assert exported.keys() == initial.keys()
    assert any(not exported[name].equal(initial[name]) for name in initial)

    rerun = check_ok(run_cli(recipe, *REFERENCE_OVERRIDES[1:], "trainer.total_training_steps=4"))
    resumed = re.search(r"resumed from \S+global_step_(\d+) \(step (\d+)\)", rerun.stderr)
    assert resumed, f"the rerun did not resume:\n{rerun.stderr[-2000:]}"
    assert int(resumed.group(1)) == REFERENCE_STEPS
    assert sorted(by_step(read_records(tmp_path / "run"))) == list(range(5))
