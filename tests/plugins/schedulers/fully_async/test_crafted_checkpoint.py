"""Resuming a fully-async run from a crafted checkpoint: a payload planted in any file the
resume reads (its manifest rewritten to match, as whoever crafted it would) is refused in one
line naming the file, and never runs."""

from __future__ import annotations

import json

import pytest

import plugrl_sim
from plugrl.errors import CheckpointError
from plugrl_sim.parts import build_sim_task, sim_recipe
from tests.crafted import SYSTEM, plant_in_torch_file, rewrite_manifest, runs_when_unpickled

SAVED_STEP = 2
FIXES = {
    # the core's file, then the backend's
    "trainer_state.pt": "delete that folder to resume from an earlier checkpoint, or set "
    "trainer.resume_mode=disable",
    "actor/sim_backend.pt": "resume from an earlier global_step_N folder or start fresh with "
    "trainer.resume_mode=disable",
}


@pytest.fixture(scope="module")
def sim_task(plugrl_build_once):
    return plugrl_build_once(build_sim_task, num_train=16, num_val=4)


def _recipe_data(sim_task, run_dir, steps):
    data = sim_recipe(
        sim_task,
        run_dir,
        scheduler="fully_async",
        colocate=False,
        train_batch_size=4,
        n=2,
        max_response_length=16,
    )
    data["trainer"]["total_training_steps"] = steps
    return data


@pytest.fixture
def run(sim_task, plugrl_recipe, plugrl_register_plugin, plugrl_plugin_manager):
    from plugrl.run.runner import run_recipe

    plugrl_register_plugin(plugrl_sim, "plugrl-sim")

    def run_to(run_dir, steps):
        run_recipe(plugrl_recipe(_recipe_data(sim_task, run_dir, steps)), plugrl_plugin_manager)

    return run_to


@pytest.fixture
def saved_run(run, tmp_path):
    """A run folder whose last checkpoint is that of step ``SAVED_STEP``."""
    folder = tmp_path / "run"
    run(folder, SAVED_STEP)
    return folder


def test_the_checkpoint_holds_exactly_the_files_this_test_plants_in(saved_run):
    step_folder = saved_run / f"global_step_{SAVED_STEP}"
    files = {
        str(path.relative_to(step_folder)) for path in step_folder.rglob("*") if path.is_file()
    }
    # a new file a resume reads needs its own case in FIXES
    assert files == {*FIXES, "plugrl_checkpoint.json"}


@pytest.mark.parametrize("name", FIXES)
def test_a_payload_in_a_file_the_resume_reads_is_refused_and_never_runs(
    run, saved_run, tmp_path, name
):
    run_dir = saved_run
    step_folder = run_dir / f"global_step_{SAVED_STEP}"
    file = step_folder / name
    marker = tmp_path / "ran"
    plant_in_torch_file(file, marker)
    assert runs_when_unpickled(file, marker)
    rewrite_manifest(step_folder)

    with pytest.raises(CheckpointError) as info:
        run(run_dir, SAVED_STEP + 2)
    assert str(info.value) == (
        f"checkpoint file {str(file)!r} holds something other than a checkpoint's data (it "
        f"refers to {SYSTEM}), so the run did not load it; {FIXES[name]}"
    )
    assert not marker.exists(), "resuming from the checkpoint ran its command"
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, SAVED_STEP + 1))  # the run went no further
