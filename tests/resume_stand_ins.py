"""Runs of the core's run loop that take milliseconds, for the resume properties: the real
loop (:func:`plugrl.run.loop.run_loop`), the real :class:`~plugrl.compose.run_parts.RunParts`
checkpoint and resume, the real :class:`~plugrl.state.checkpoint.CheckpointManager`, the
real prompt loader and random generators, and (for fully_async) the real scheduler's start,
rollouter, staleness account and snapshot; only the model, the engines and the reward are
stand-ins.

The stand-in actor's weights are a digest of every batch it trained on, in order, with a draw
of each random generator; its checkpoint holds the digest and the ledger of the sample uids
it trained. A resumed run whose digest and ledger equal the uninterrupted run's trained the
same samples in the same order with the same random numbers, each exactly once.

A run is killed in-process as SIGTERM stops ``plugrl run`` (a ``KeyboardInterrupt`` in the
driver), at a named point (:data:`SYNC_KILL_POINTS`, :data:`ASYNC_KILL_POINTS`) of a chosen
step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import numpy as np
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

import plugrl.state.checkpoint as checkpoint_module
from plugrl.compose.run_parts import RunParts
from plugrl.parts.agent import Trajectory
from plugrl.parts.rollout import Capability, Completion
from plugrl.parts.scheduler import Scheduler
from plugrl.run.loop import run_loop
from plugrl.run.runner import RunContext
from plugrl.state import rng
from plugrl.state.checkpoint import TRAINER_STATE_FILE, CheckpointManager, load_weights_only
from plugrl_fully_async.scheduler import FullyAsyncScheduler

SAVE_KILL_POINTS = ("save_parts", "save_before_tracker", "save_before_prune")
"""Points inside a checkpoint save: while the parts write their files, after the folder is in
place but before ``latest_checkpointed_iteration.txt`` names it, and after that."""
SYNC_KILL_POINTS = ("mid_step", "after_update", "after_log", *SAVE_KILL_POINTS)
"""``mid_step``: the step's batch is drawn from the loader, nothing trained; ``after_update``:
trained, not logged; ``after_log``: logged, not saved."""
ASYNC_KILL_POINTS = ("in_flight", *SYNC_KILL_POINTS)
"""``in_flight``: the samples of the step are taken from the rollouter and more are being
generated; ``mid_step`` there is the same after the trainer waited for one more to finish."""


class Killed(KeyboardInterrupt):
    """The in-process SIGTERM of a killed segment."""


@attrs.define
class Kill:
    """Kill the run at ``point`` of step ``step`` (once)."""

    step: int
    point: str
    done: bool = False

    def at(self, point: str, step: int) -> None:
        if not self.done and point == self.point and step == self.step:
            self.done = True
            raise Killed(f"killed at {point} of step {step}")


class ToyActor:
    """A backend stand-in: its weights are a digest of what it trained on, in order."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.digest = "start"
        self.ledger: list[str] = []

    def train(self, uids: list[str]) -> dict[str, float]:
        # every generator the checkpoint restores takes part in the weights
        draw = (random.random(), float(np.random.rand()), float(torch.rand(1)))
        text = f"{self.digest}|{','.join(uids)}|{draw!r}"
        self.digest = hashlib.sha256(text.encode()).hexdigest()
        self.ledger.extend(uids)
        return {
            "toy/weights": int(self.digest[:12], 16) / 16**12,
            "toy/draw": sum(draw),
            # metrics the learning-health checks watch, from the weights: runs of clipped
            # steps and falls of entropy make checks fire, whose counts a resume must keep
            "response_length/clip_ratio": 1.0 if int(self.digest[12], 16) < 12 else 0.5,
            "actor/entropy": 0.2 * (int(self.digest[13], 16) + 1) / 16,
        }

    def save_checkpoint(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        state = {"digest": self.digest, "ledger": self.ledger}
        (folder / "toy.json").write_text(json.dumps(state), encoding="utf-8")
        self.harness.kill_at("save_parts")

    def load_checkpoint(self, folder: Path) -> None:
        state = json.loads((folder / "toy.json").read_text(encoding="utf-8"))
        self.digest, self.ledger = state["digest"], list(state["ledger"])

    def rollout_model(self) -> str:
        return self.digest

    def close(self) -> None:
        pass


class ToyEngines:
    """The engines: the model they sample with is the actor's (``bind_model``); each request
    ends after ``delay_s``, its tokens of the version the engines had when it was sent."""

    capabilities = frozenset({Capability.STREAM, Capability.SHARE_MODEL})
    num_engines = 1
    recipe = None

    def __init__(self, delay_s: float = 0.0) -> None:
        self.version = 0
        self.delay_s = delay_s

    def bind_model(self, model: Any, version: int) -> None:
        self.version = version

    async def agenerate(self, request: Any) -> list[Completion]:
        version = self.version
        await asyncio.sleep(self.delay_s)
        return [
            Completion(
                token_ids=[7, 8],
                log_probs=[-1.0, -1.0],
                finish_reason="stop",
                weight_version=version,
                sample_index=index,
            )
            for index in range(request.params.n)
        ]

    def pause(self, mode: str) -> None:
        pass

    def resume(self) -> None:
        pass

    def abort_all(self) -> None:
        pass

    def abort(self, request_ids: list[str]) -> None:
        pass

    def close(self) -> None:
        pass


class ToyReward:
    def close(self) -> None:
        pass


class ToySyncScheduler(Scheduler):
    """The sync scheduler's use of the loader: one batch of ``data.train_batch_size`` prompts a
    step, trained at once; it keeps a count of its steps in the checkpoint."""

    def __init__(self, config: Any, context: HarnessContext) -> None:
        super().__init__(config, context)
        self.harness = context.harness
        self.calls = 0

    def start(self, parts: RunParts, step: int, saved: dict[str, Any] | None) -> None:
        self.harness.started_at.append(step)
        self.calls = int((saved or {}).get("calls", 0))

    def train_step(self, parts: RunParts, step: int) -> dict[str, Any]:
        batch = parts.train_loader.next_batch()
        self.harness.kill_at("mid_step", step)
        metrics = parts.actor.train(list(batch["uid"]))
        parts.weight_version += 1
        parts.sync_weights()
        self.calls += 1
        metrics.update(
            {
                "toy/epoch": float(batch.meta["epoch"]),
                "toy/position": float(parts.train_loader.position),
                "toy/consumed": float(len(parts.actor.ledger)),
                "toy/calls": float(self.calls),
                "toy/weight_version": float(parts.weight_version),
            }
        )
        self.harness.kill_at("after_update", step)
        return metrics

    def checkpoint_state(self) -> dict[str, Any]:
        return {"calls": self.calls}


class ToyFullyAsyncScheduler(FullyAsyncScheduler):
    """The fully_async scheduler with its start, rollouter, account, weight syncs and snapshot
    as they are; a step takes ``required_samples`` from the rollouter and trains the actor on
    their uids. With ``agents`` the rollouter samples through an agent sampler that answers
    each prompt with trajectories of two sequences each (a multi-call agent)."""

    agents_on = False

    def __init__(self, config: Any, context: HarnessContext) -> None:
        super().__init__(config, context)
        self.harness = context.harness

    def start(self, parts: RunParts, step: int, saved: dict[str, Any] | None) -> None:
        self.harness.started_at.append(step)
        super().start(parts, step, saved)

    def agent_sampler(self, parts: RunParts) -> Any:
        if not self.agents_on:
            return None
        engines = parts.engines

        def sample(prompt: Any, params: Any, prefix: str) -> concurrent.futures.Future:
            version = engines.version
            future: concurrent.futures.Future = concurrent.futures.Future()
            ids = list(prompt["raw_prompt_ids"][0])
            future.set_result(
                [
                    [
                        [
                            Trajectory(
                                prompt_ids=ids + [5] * turn,
                                response_ids=[7, 8],
                                loss_mask=[1, 1],
                                log_probs=[-1.0, -1.0],
                                token_versions=[version, version],
                                weight_version=version,
                            )
                            for turn in range(2)
                        ]
                        for _ in range(params.n)
                    ]
                ]
            )
            return future

        return sample

    def train_step(self, parts: RunParts, step: int) -> dict[str, Any] | None:
        rollouter = self.rollouter or self.start_rollouter(parts)
        samples, _ = rollouter.take(self.required_samples)
        if len(samples) < self.required_samples:
            return None
        kill = self.harness.kill
        if kill is not None and (kill.point, kill.step) == ("in_flight", step):
            deadline = time.monotonic() + 0.05
            while rollouter.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            event(f"killed with samples in flight: {rollouter.in_flight > 0}")
        self.harness.kill_at("in_flight", step)
        if self.agents_on:
            assert all(len(s.trajectories) == self.recipe.rollout.n for s in samples)
        self.harness.saw_in_flight |= rollouter.in_flight > 0
        self.harness.kill_at("mid_step", step)
        parts.actor.train([sample.prompt["uid"][0] for sample in samples])
        account = rollouter.account
        if account.period_complete:
            rollouter.sync(lambda: self.push_weights(parts))
        self.harness.kill_at("after_update", step)
        return {
            "toy/consumed": float(len(parts.actor.ledger)),
            "toy/trained": float(account.trained),
            "toy/weight_version": float(parts.weight_version),
        }

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()
        self.harness.saved_with_outstanding |= bool(state.get("prompts"))
        return state


class KillableCheckpoints(CheckpointManager):
    """The run's checkpoint manager, killable once ``latest_checkpointed_iteration.txt``
    names the new checkpoint, before the old ones are pruned."""

    harness: Harness

    def prune(self) -> None:
        # the tracker names the new checkpoint now
        self.harness.tracked = self.harness._saving_step()
        self.harness.kill_at("save_before_prune")
        super().prune()


@attrs.define
class HarnessContext(RunContext):
    """The run context of a stand-in run: :meth:`build_parts` builds the stand-ins."""

    harness: Harness | None = None

    def build_parts(self, engine_needs: Any = None) -> RunParts:
        return self.harness.build_parts()

    def step_end(self, step: int, metrics: Any) -> None:
        super().step_end(step, metrics)
        self.harness.logged.append((step, dict(metrics)))
        self.harness.kill_at("after_log", step)


@attrs.define
class Outcome:
    """What a run, over all its segments, left: the metrics of each step (the last logged),
    and the final checkpoint's actor and trainer state."""

    metrics: dict[int, dict[str, Any]]
    digest: str
    ledger: list[str]
    trainer_state: dict[str, Any]
    segments: int


class Harness:
    """One run of ``recipe`` in ``run_dir`` with the stand-in parts, killed at ``kills`` (in
    order, each segment resumed with ``trainer.resume_mode=auto``)."""

    def __init__(
        self,
        recipe: Any,
        plugins: Any,
        dataset: Any,
        run_dir: Path,
        *,
        scheduler: type[Scheduler],
        engine_delay_s: float = 0.0,
    ) -> None:
        self.recipe, self.plugins, self.dataset = recipe, plugins, dataset
        self.run_dir = run_dir
        self.scheduler_cls = scheduler
        self.engine_delay_s = engine_delay_s
        self.kill: Kill | None = None
        self.logged: list[tuple[int, dict[str, Any]]] = []
        self.parts: RunParts | None = None
        self.saw_in_flight = False
        self.tracked = 0
        """The step of the checkpoint ``latest_checkpointed_iteration.txt`` names."""
        self.started_at: list[int] = []
        """The step each segment started from."""
        self.tracked_at_kills: list[int] = []
        """The checkpoint the tracker named when each kill happened."""
        self.saved_with_outstanding = False

    def kill_at(self, point: str, step: int | None = None) -> None:
        """Kill the run if this is its kill's point; ``step`` defaults to the step being
        saved (the loop logs a step, then saves it)."""
        if self.kill is not None:
            self.kill.at(point, self._saving_step() if step is None else step)

    def drawn_uids(self, loader_state: dict[str, int]) -> list[str]:
        """The uids of the prompts a loader at ``loader_state`` has handed out, in order."""
        from plugrl.compose.run_parts import training_loader

        loader = training_loader(self.recipe, self.dataset, 0)
        epoch, position = loader_state["epoch"], loader_state["position"]
        return [
            f"{e}-{self.dataset[int(index)].index}"
            for e in range(epoch + 1)
            for index in loader.epoch_order(e)[: position if e == epoch else None]
        ]

    def build_parts(self) -> RunParts:
        from plugrl.compose.run_parts import training_loader

        recipe = self.recipe
        rng.seed_all(recipe.trainer.seed)
        checkpoints = KillableCheckpoints(
            self.run_dir,
            recipe.trainer.max_ckpt_to_keep,
            checksums=recipe.trainer.checkpoint_checksums,
        )
        checkpoints.harness = self
        loader = training_loader(recipe, self.dataset, 0)
        self.parts = RunParts(
            recipe=recipe,
            plugins=self.plugins,
            device=None,
            tokenizer=None,
            pad_token_id=0,
            train_data=self.dataset,
            val_data=None,
            train_loader=loader,
            reward=ToyReward(),
            estimator=None,
            objective=None,
            kl_in_reward=None,
            actor=ToyActor(self),
            ref=None,
            critic=None,
            engines=ToyEngines(self.engine_delay_s),
            transport=None,
            checkpoints=checkpoints,
            total_training_steps=recipe.trainer.total_training_steps,
            shares_model=True,
        )
        return self.parts

    def segment(self, kill: Kill | None) -> bool:
        """One segment of the run; whether it was killed."""
        self.kill = kill
        recipe = self.recipe
        context = HarnessContext(recipe, self.run_dir, self.plugins, "cpu", harness=self)
        scheduler = self.scheduler_cls(recipe.scheduler, context)
        try:
            with self._killable_tracker():
                run_loop(context, scheduler)
        except Killed:
            self.tracked_at_kills.append(self.tracked)
            return True
        return False

    @contextlib.contextmanager
    def _killable_tracker(self) -> Iterator[None]:
        # the folder is in place once its directory entry is synced: the next line of the
        # save names it in latest_checkpointed_iteration.txt
        fsync_dir = checkpoint_module._fsync_dir

        def killable(path: Path) -> None:
            fsync_dir(path)
            self.kill_at("save_before_tracker")

        with mock.patch.object(checkpoint_module, "_fsync_dir", killable):
            yield

    def _saving_step(self) -> int:
        return max((step for step, _ in self.logged), default=0)

    def run(self, kills: list[Kill]) -> Outcome:
        """Segments killed at ``kills`` in order (a kill whose step the run never reaches does
        not happen), then one that runs to the end, each resumed from the checkpoint the one
        before left (``trainer.resume_mode=auto``)."""
        resumed_after: list[int] = []
        for kill in kills:
            if self.segment(kill):
                resumed_after.append(len(self.started_at))
        self.segment(None)
        # a segment after a kill goes on from the checkpoint the tracker named: nothing the
        # run saved completely is done again, nothing is skipped
        for segment, tracked in zip(resumed_after, self.tracked_at_kills, strict=True):
            assert self.started_at[segment] == tracked, (self.started_at, self.tracked_at_kills)
        return self.outcome(len(kills) + 1)

    def outcome(self, segments: int) -> Outcome:
        manager = CheckpointManager(self.run_dir)
        latest = manager.latest()
        assert latest is not None, "a finished run leaves a checkpoint of its last step"
        actor = json.loads((latest / "actor" / "toy.json").read_text(encoding="utf-8"))
        state = load_weights_only(latest / TRAINER_STATE_FILE, fix="")
        metrics: dict[int, dict[str, Any]] = {}
        for step, logged in self.logged:
            metrics[step] = logged
        return Outcome(metrics, actor["digest"], actor["ledger"], state, segments)


def scratch_folder() -> tempfile.TemporaryDirectory:
    """A temporary folder in memory where the system has one: the checkpoints' fsync calls,
    which guard against a power cut and not against a killed process, then cost nothing."""
    memory = Path("/dev/shm")
    in_memory = memory.is_dir() and os.access(memory, os.W_OK)
    return tempfile.TemporaryDirectory(dir=memory if in_memory else None, prefix="plugrl-resume-")


def sub_dataset(dataset: Any, size: int) -> Any:
    """The first ``size`` prompts of ``dataset``, as a dataset of their own."""
    view = copy.copy(dataset)
    view.records = dataset.records[:size]
    return view


# ------------------------------------------------------------------------------ run shapes

RESUME_PROFILE = settings(
    # the same cases on every machine and every run (CI), however loaded the machine is
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""The hypothesis settings of the resume properties (each test sets its ``max_examples``)."""


def toy_run_factory(sim_task: Any) -> Callable[..., Harness]:
    """``make(shape, run_dir, scheduler=ToySyncScheduler, **{"section.option": value})`` -> a
    :class:`Harness` of a run of that shape on the first ``shape.prompts`` prompts of
    ``sim_task``, its recipe the simulated one with those options set."""
    from transformers import AutoTokenizer

    from plugrl.data.dataset import PromptDataset
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.testing import make_recipe
    from plugrl_sim.parts import sim_recipe

    plugins = get_plugin_manager()
    bases = {
        name: make_recipe(
            base=sim_recipe(sim_task, "unused", scheduler=name, train_batch_size=1, colocate=False),
            plugins=plugins,
        )
        for name in ("sync", "fully_async")
    }
    dataset = PromptDataset.train(
        bases["sync"].data, AutoTokenizer.from_pretrained(sim_task.tokenizer)
    )

    def make(
        shape: RunShape,
        run_dir: Path,
        scheduler: type[Scheduler] = ToySyncScheduler,
        engine_delay_s: float = 0.0,
        **options: Any,
    ) -> Harness:
        base = bases["fully_async" if issubclass(scheduler, FullyAsyncScheduler) else "sync"]
        recipe = attrs.evolve(
            base,
            data=attrs.evolve(
                base.data, train_batch_size=shape.batch_size, shuffle=shape.shuffle, seed=shape.seed
            ),
            actor=attrs.evolve(base.actor, ppo_mini_batch_size=shape.batch_size),
            trainer=attrs.evolve(
                base.trainer,
                total_training_steps=shape.steps,
                save_freq=shape.save_freq,
                max_ckpt_to_keep=shape.keep,
                seed=shape.seed,
                default_local_dir=str(run_dir),
                resume_mode="auto",
                logger=[],
            ),
        )
        for key, value in options.items():
            section, name = key.split(".")
            changed = attrs.evolve(getattr(recipe, section), **{name: value})
            recipe = attrs.evolve(recipe, **{section: changed})
        return Harness(
            recipe,
            plugins,
            sub_dataset(dataset, shape.prompts),
            run_dir,
            scheduler=scheduler,
            engine_delay_s=engine_delay_s,
        )

    return make


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
def run_shapes(draw: Any, max_batch: int = 4, max_steps: int = 10) -> RunShape:
    prompts = draw(st.integers(2, 9))
    return RunShape(
        prompts=prompts,
        batch_size=draw(st.integers(1, min(max_batch, prompts))),
        steps=draw(st.integers(1, max_steps)),
        save_freq=draw(st.integers(1, 4)),
        keep=draw(st.sampled_from([None, 1, 2])),
        seed=draw(st.integers(0, 3)),
        shuffle=draw(st.booleans()),
    )


@st.composite
def kills(draw: Any, shape: RunShape, points: tuple[str, ...]) -> Kill:
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
def killed_runs(
    draw: Any, points: tuple[str, ...] = SYNC_KILL_POINTS, **shape_options: Any
) -> tuple[RunShape, list[Kill]]:
    """A run shape and one or two kills of it."""
    shape = draw(run_shapes(**shape_options))
    return shape, draw(st.lists(kills(shape, points), min_size=1, max_size=2))


def note_kills(planned: list[Kill]) -> None:
    """Count in hypothesis' statistics where the runs were killed."""
    for kill in planned:
        event(f"killed at {kill.point}" if kill.done else "a kill after the run's end")


def comparable(metrics: dict[str, Any]) -> dict[str, Any]:
    """A step's metrics without the clock and the memory, which differ between any two runs."""
    return {k: v for k, v in metrics.items() if not k.startswith(("perf/", "timing_s/"))}
