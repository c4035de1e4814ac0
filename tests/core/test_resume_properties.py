"""Resume properties of the core's run loop: a run killed at any step (mid-step, after the
update, between the log and the checkpoint, while it saves), at an epoch boundary or not,
once or twice, and resumed each time from its latest checkpoint, ends as the uninterrupted
run: the same metrics for every step, the same counters (step, epoch, loader position,
weight version, consumed samples, the scheduler's own), the same weights, and the same
ledger of trained samples, each trained exactly once.

The runs are the real loop, checkpoint and loader with stand-in parts (tests/resume_stand_ins.py),
a few milliseconds each, so that hypothesis can try hundreds of run shapes and kill points.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, given, settings

from tests.resume_stand_ins import (
    RESUME_PROFILE,
    RunShape,
    comparable,
    killed_runs,
    note_kills,
    scratch_folder,
    toy_run_factory,
)

pytestmark = pytest.mark.slow
SYNC_CASES = 160


@pytest.fixture(scope="module")
def toy_run(sim_task):
    return toy_run_factory(sim_task)


def check_same_run(resumed, whole, shape: RunShape) -> None:
    assert sorted(resumed.metrics) == sorted(whole.metrics) == list(range(1, shape.steps + 1))
    for step in whole.metrics:
        assert comparable(resumed.metrics[step]) == comparable(whole.metrics[step]), step
    assert resumed.digest == whole.digest
    assert resumed.ledger == whole.ledger
    assert len(resumed.ledger) == shape.steps * shape.batch_size
    # a uid names a prompt of an epoch: trained once each
    assert len(set(resumed.ledger)) == len(resumed.ledger)
    for key in ("step", "dataloader", "weight_version", "scheduler"):
        assert resumed.trainer_state[key] == whole.trainer_state[key], key


@settings(RESUME_PROFILE, max_examples=SYNC_CASES)
@given(killed_runs())
def test_a_sync_run_killed_anywhere_resumes_to_the_uninterrupted_run(toy_run, case):
    shape, planned = case
    with scratch_folder() as folder:
        whole = toy_run(shape, Path(folder) / "whole").run([])
        resumed = toy_run(shape, Path(folder) / "killed").run(planned)
    note_kills(planned)
    fired = sorted({k for metrics in whole.metrics.values() for k in metrics if "health/" in k})
    event(f"health checks fired: {', '.join(fired) or 'none'}")
    check_same_run(resumed, whole, shape)
