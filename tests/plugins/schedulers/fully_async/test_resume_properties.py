"""Resume properties of the fully-async scheduler: a run killed at any step, with samples in
the buffer and in flight, mid-step, between the log and the checkpoint or while it saves, and
resumed from its latest checkpoint, trains every prompt it drew exactly once: no sample of
the buffer or in flight at the checkpoint is lost or trained twice, and the run ends with the
uninterrupted run's counters (steps, samples trained, and with a weight sync every step the
weight version).

The runs are the core's real loop, checkpoint and loader, and the scheduler's real start,
rollouter, staleness account and snapshot, with stand-in engines and actor
(tests/resume_stand_ins.py); the agent cases sample each prompt through the rollouter's agent
path with trajectories of two sequences. Which prompts a step trains depends on when the
engines finish them, in an uninterrupted run too, so the trained order is not compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.resume_stand_ins import (
    ASYNC_KILL_POINTS,
    RESUME_PROFILE,
    ToyFullyAsyncScheduler,
    killed_runs,
    note_kills,
    scratch_folder,
    toy_run_factory,
)

pytestmark = pytest.mark.slow
ASYNC_CASES = 100
AGENT_CASES = 50


class ToyAgentScheduler(ToyFullyAsyncScheduler):
    agents_on = True


@pytest.fixture(scope="module")
def toy_run(sim_task):
    return toy_run_factory(sim_task)


async_options = st.fixed_dictionaries(
    {
        "scheduler.trigger_parameter_sync_step": st.integers(1, 3),
        "scheduler.staleness_threshold": st.sampled_from([0.0, 0.5, 1.0]),
        "scheduler.require_batches": st.integers(1, 2),
        "scheduler.max_in_flight_per_engine": st.integers(1, 6),
    }
)


def check_every_drawn_prompt_trained_once(harness, outcome, whole, shape, options) -> None:
    required = shape.batch_size * options["scheduler.require_batches"]
    steps = list(range(1, shape.steps + 1))
    assert sorted(outcome.metrics) == sorted(whole.metrics) == steps
    for step in steps:
        for key in ("toy/consumed", "toy/trained"):
            assert outcome.metrics[step][key] == whole.metrics[step][key] == step * required
    if options["scheduler.trigger_parameter_sync_step"] == 1:
        # every step ends in a sync, so every checkpoint is at one: a resume keeps the versions
        for step in steps:
            assert outcome.metrics[step]["toy/weight_version"] == step
    saved = outcome.trainer_state["scheduler"]
    assert outcome.trainer_state["step"] == shape.steps
    assert saved["account"]["trained"] == shape.steps * required
    # the final checkpoint's ledger and the prompts it keeps to generate again are, together,
    # every prompt the stream handed out, each once
    outstanding = [f"{epoch}-{index}" for epoch, index in saved["prompts"]]
    drawn = harness.drawn_uids(saved["dataloader"])
    assert len(outcome.ledger) == shape.steps * required
    assert sorted(outcome.ledger + outstanding) == sorted(drawn)
    event(f"resumed with {'some' if harness.saved_with_outstanding else 'no'} samples kept")


def run_case(toy_run, case, options, scheduler, delay_s):
    shape, planned = case
    with scratch_folder() as folder:
        whole = toy_run(shape, Path(folder) / "whole", scheduler, delay_s, **options).run([])
        harness = toy_run(shape, Path(folder) / "killed", scheduler, delay_s, **options)
        outcome = harness.run(planned)
    note_kills(planned)
    check_every_drawn_prompt_trained_once(harness, outcome, whole, shape, options)


@settings(RESUME_PROFILE, max_examples=ASYNC_CASES)
@given(
    killed_runs(ASYNC_KILL_POINTS, max_batch=3, max_steps=8),
    async_options,
    st.sampled_from([0.0, 0.001]),
)
def test_a_fully_async_run_killed_anywhere_trains_every_prompt_once(
    toy_run, case, options, delay_s
):
    run_case(toy_run, case, options, ToyFullyAsyncScheduler, delay_s)


@settings(RESUME_PROFILE, max_examples=AGENT_CASES)
@given(
    killed_runs(ASYNC_KILL_POINTS, max_batch=3, max_steps=6),
    async_options,
    st.sampled_from([0.0, 0.001]),
)
def test_a_fully_async_agent_run_killed_anywhere_trains_every_prompt_once(
    toy_run, case, options, delay_s
):
    run_case(toy_run, case, options, ToyAgentScheduler, delay_s)
