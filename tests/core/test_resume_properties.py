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

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from plugrl.data.dataset import PromptDataset
from plugrl.plugin.manager import get_plugin_manager
from plugrl.testing import make_recipe
from plugrl_sim.parts import sim_recipe
from tests.resume_stand_ins import (
    SAVE_KILL_POINTS,
    SYNC_KILL_POINTS,
    Harness,
    Kill,
    ToySyncScheduler,
    comparable,
    scratch_folder,
    sub_dataset,
)

pytestmark = pytest.mark.slow

settings.register_profile(
    "resume",
    # the same cases on every machine and every run (CI), however loaded the machine is
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RESUME = settings.get_profile("resume")
SYNC_CASES = 60


@pytest.fixture(scope="module")
def toy_run(sim_task):
    """``toy_run(shape)`` -> a Harness factory for a run of that shape in a fresh folder."""
    plugins = get_plugin_manager()
    base = make_recipe(base=sim_recipe(sim_task, "unused", train_batch_size=1), plugins=plugins)
    dataset = PromptDataset.train(base.data, _tokenizer(sim_task))

    def make(shape: RunShape, run_dir: Path, scheduler=ToySyncScheduler, **options) -> Harness:
        data = attrs.evolve(
            base.data, train_batch_size=shape.batch_size, shuffle=shape.shuffle, seed=shape.seed
        )
        trainer = attrs.evolve(
            base.trainer,
            total_training_steps=shape.steps,
            save_freq=shape.save_freq,
            max_ckpt_to_keep=shape.keep,
            seed=shape.seed,
            default_local_dir=str(run_dir),
            resume_mode="auto",
            logger=[],
        )
        recipe = attrs.evolve(base, data=data, trainer=trainer)
        for key, value in options.items():
            section, name = key.split(".")
            recipe = attrs.evolve(
                recipe, **{section: attrs.evolve(getattr(recipe, section), **{name: value})}
            )
        view = sub_dataset(dataset, shape.prompts)
        return Harness(recipe, plugins, view, run_dir, scheduler=scheduler)

    return make


def _tokenizer(task):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(task.tokenizer)


@attrs.frozen
class RunShape:
    prompts: int
    batch_size: int
    steps: int
    save_freq: int
    keep: int | None
    seed: int
    shuffle: bool

    @property
    def steps_per_epoch(self) -> int:
        return self.prompts // self.batch_size


@st.composite
def run_shapes(draw, max_batch: int = 4, max_steps: int = 10) -> RunShape:
    prompts = draw(st.integers(2, 9))
    batch_size = draw(st.integers(1, min(max_batch, prompts)))
    return RunShape(
        prompts=prompts,
        batch_size=batch_size,
        steps=draw(st.integers(1, max_steps)),
        save_freq=draw(st.integers(1, 4)),
        keep=draw(st.sampled_from([None, 1, 2])),
        seed=draw(st.integers(0, 3)),
        shuffle=draw(st.booleans()),
    )


@st.composite
def kills(draw, shape: RunShape, points: tuple[str, ...]) -> Kill:
    """A kill at any step, at an epoch boundary (the last step of an epoch or the first of
    the next), or, during a save, at a step that saves."""
    point = draw(st.sampled_from(points))
    per_epoch = shape.steps_per_epoch
    boundaries = [
        step
        for epoch in range(1, shape.steps // per_epoch + 1)
        for step in (epoch * per_epoch, epoch * per_epoch + 1)
        if step <= shape.steps
    ]
    saves = [s for s in range(1, shape.steps + 1) if s % shape.save_freq == 0 or s == shape.steps]
    if point in SAVE_KILL_POINTS:
        step = draw(st.sampled_from(saves))
    elif boundaries and draw(st.booleans()):
        step = draw(st.sampled_from(boundaries))
    else:
        step = draw(st.integers(1, shape.steps))
    return Kill(step, point)


@st.composite
def killed_runs(draw, points: tuple[str, ...] = SYNC_KILL_POINTS, **shape_options):
    shape = draw(run_shapes(**shape_options))
    planned = draw(st.lists(kills(shape, points), min_size=1, max_size=2))
    return shape, planned


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


@settings(RESUME, max_examples=SYNC_CASES)
@given(killed_runs())
def test_a_sync_run_killed_anywhere_resumes_to_the_uninterrupted_run(toy_run, case):
    shape, planned = case
    with scratch_folder() as folder:
        whole = toy_run(shape, Path(folder) / "whole").run([])
        resumed = toy_run(shape, Path(folder) / "killed").run(planned)
    for kill in planned:
        event(f"killed at {kill.point}" if kill.done else "a kill after the run's end")
    check_same_run(resumed, whole, shape)
