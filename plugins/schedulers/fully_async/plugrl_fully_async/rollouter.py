"""The rollouter: streams prompts one at a time into the engine group, a bounded number in
flight, within the staleness bound, and puts each finished sample in the buffer; under a strict
lag bound it also ends the samples that can no longer train.

It runs on an event loop in a thread of its own and drives the engines only through the engine
group's API (``agenerate``, ``pause``/``resume``, ``abort_all``) and the capabilities the
engines declare, so any engine (or a stand-in that only sleeps) works under it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from plugrl.api.data import IMAGES_COLUMN, MULTIMODAL_COLUMN, VIDEOS_COLUMN
from plugrl.api.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    SamplingParams,
    continuation_request,
    in_prompt_order,
    join_completions,
)

from .accounting import PauseReason, StalenessAccount

if TYPE_CHECKING:
    from plugrl.api.agents import Trajectory
    from plugrl.api.cluster import EngineGroup
    from plugrl.api.data import Batch, PromptLoader

    from .buffer import SampleBuffer

logger = logging.getLogger("plugrl.run")

PartialMode = Literal["keep", "abort"]
AgentSampler = Callable[[Any, SamplingParams, str], "concurrent.futures.Future"]
"""``(prompt batch of one row, sampling params, request prefix)`` -> a future of that row's
samples, each a list of trajectories (:meth:`plugrl.agents.session.AgentRuntime.submit`)."""
PromptKey = tuple[int, int]
"""(epoch, dataset position) of a prompt: enough to build it again after a resume."""

# how often a waiting trainer looks at the rollouter's health
_POLL_S = 0.2

PAUSE_SUMMARY_STEPS = 10
"""The first pause at the staleness bound is explained in full; after it, a line every this
many trainer steps counts the pauses since the last line (when there were any)."""


class PromptStream:
    """The training prompts one at a time, in the order the loader would batch them (seeded
    shuffle per epoch); the position lives in the loader, so its ``state_dict`` resumes it."""

    def __init__(self, loader: PromptLoader) -> None:
        self.loader = loader

    def next_key(self) -> PromptKey:
        loader = self.loader
        if loader.position >= len(loader.dataset):
            loader.epoch += 1
            loader.position = 0
        position = int(loader.epoch_order(loader.epoch)[loader.position])
        loader.position += 1
        return (loader.epoch, position)

    def prompt(self, key: PromptKey) -> Batch:
        """A one-row prompt batch, with the ``uid`` the loader gives the prompt."""
        from plugrl.api.data import collate

        epoch, position = key
        loader = self.loader
        record = loader.dataset[position]
        uid = f"{loader.uid_prefix}{epoch}-{record.index}"
        with_images = getattr(loader.dataset, "has_images", False)
        batch = collate([record], [uid], loader.pad_token_id, with_images=with_images)
        batch.meta["epoch"] = epoch
        return batch

    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()


@attrs.define
class Sample:
    """One prompt and its responses, as the trainer takes it: ``completions`` of the
    engines, or, in a run with agent loops, ``trajectories`` (each response's sequences)."""

    sample_id: int
    key: PromptKey
    prompt: Batch
    completions: list[Completion]
    trajectories: list[list[Trajectory]] = attrs.field(factory=list)

    def _sampled_versions(self) -> list[int]:
        return [
            version
            for sequences in self.trajectories
            for trajectory in sequences
            for version, sampled in zip(
                trajectory.token_versions, trajectory.loss_mask, strict=True
            )
            if sampled
        ] or [t.weight_version for sequences in self.trajectories for t in sequences]

    @property
    def oldest_version(self) -> int:
        """The oldest version of a sampled token: a trajectory is as stale as its first
        turn, however many turns and syncs it spans."""
        if self.trajectories:
            return min(self._sampled_versions())
        return min(c.min_weight_version for c in self.completions)

    @property
    def newest_version(self) -> int:
        if self.trajectories:
            return max(self._sampled_versions())
        return max(c.max_weight_version for c in self.completions)

    @property
    def response_tokens(self) -> int:
        if self.trajectories:
            return sum(len(t.response_ids) for s in self.trajectories for t in s)
        return sum(len(c.token_ids) for c in self.completions)


class Rollouter:
    """Generates samples into ``buffer`` until closed (or ``stop_after`` samples started).

    ``partial``: how a weight sync treats responses in flight: ``"keep"`` pauses them and they
    continue with the new weights; ``"abort"`` ends them and sends the rest again
    (:func:`continuation_request`); ``None`` lets them finish before the sync.
    """

    def __init__(
        self,
        *,
        engines: EngineGroup,
        account: StalenessAccount,
        stream: PromptStream,
        buffer: SampleBuffer,
        sampling_params: Callable[[int], SamplingParams],
        max_in_flight: int,
        partial: PartialMode | None,
        stop_after: int | None = None,
        resubmit: Sequence[PromptKey] = (),
        cluster_mode: str | None = None,
        on_finished: Callable[[Sample], None] | None = None,
        agents: AgentSampler | None = None,
    ) -> None:
        self.engines = engines
        self.agents = agents
        """In a run with agent loops: what runs a prompt's samples through them
        (``agents(prompt, params, request_prefix)`` -> a future of the samples'
        trajectories); each prompt is then one unit in flight, whatever its turns."""
        self.on_finished = on_finished
        """Called (in a worker thread) with each sample that goes to the buffer, before it
        does: the scheduler starts scoring it there."""
        recipe = getattr(engines, "recipe", None)
        self.cluster_mode = cluster_mode or (recipe.cluster.mode if recipe else "local")
        """The run's ``cluster.mode``, which the pause line's advice fits: the engine group's
        recipe's unless given."""
        self.account = account
        self.stream = stream
        self.buffer = buffer
        self.sampling_params = sampling_params
        self.max_in_flight = max_in_flight
        self.partial = partial
        self.stop_after = stop_after
        self.lock = threading.Condition()
        """Guards the account, the stream, and the counters below."""
        self.outstanding: dict[int, PromptKey] = {}
        """Samples started and not yet taken by the trainer, in start order."""
        self._started_at: dict[int, int] = {}
        """The weight version when each sample in flight was sent."""
        self._doomed: set[int] = set()
        """Samples in flight aborted because they were already too old to train."""
        self._dropped_lags: list[int] = []
        """Lags of the samples dropped outside :meth:`take` (ended in flight too old, or too
        old at a sync while waiting) since the trainer last took samples."""
        self._fetched: list[Sample] = []
        """Samples the trainer fetched from the buffer and has not taken yet (its thread
        only)."""
        self.can_abort = Capability.ABORT in engines.capabilities
        self._resubmit: deque[PromptKey] = deque(tuple(key) for key in resubmit)
        self._next_id = 0
        self.in_flight = 0
        self.response_tokens = 0
        self.partial_samples = 0
        self._holding = False
        self._pause_explained = False
        self._pauses_reported = account.pauses
        """The pause count the last pause line reported (lock held)."""
        self._steps_taken = 0
        self._stopping = False
        self.error: BaseException | None = None
        self._engines_paused = False
        self._idle = _StateClock(on=True)
        """No request in flight, or the engines paused for a weight sync: nothing to compute."""
        self._paused = _StateClock(on=False)
        """Starting no sample: at the staleness bound, or holding for a weight sync."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plugrl-rollouter", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def close(self) -> None:
        """Stop starting samples and end those in flight (their results are not kept)."""
        if not self._ready.is_set():
            return  # never started
        with self.lock:
            self._stopping = True
            self.lock.notify_all()
        self._notify()
        if self.in_flight:
            try:
                self.engines.abort_all()
            except Exception as exc:  # stopping must not hide the error that ended the run
                logger.warning("aborting the rollouter's requests failed: %s", exc)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._ready.set()
        tasks: set[asyncio.Task] = set()
        try:
            while not self._stopping:
                launch = self._try_start()
                if launch is None:
                    await self._changed.wait()
                    self._changed.clear()
                    continue
                task = asyncio.ensure_future(self._generate(*launch))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            if tasks:
                await asyncio.wait(tasks, timeout=30)
                for task in tasks:
                    task.cancel()
                # a cancelled sample ends here, not as a pending task reported at exit
                if tasks:
                    await asyncio.wait(tasks, timeout=10)

    def _notify(self) -> None:
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(changed.set)

    # ------------------------------------------------------------------ starting samples

    def _try_start(self) -> tuple[int, PromptKey, int] | None:
        with self.lock:
            if self._stopping or self._holding or self.in_flight >= self.max_in_flight:
                return None
            if self.stop_after is not None and self.account.started >= self.stop_after:
                return None
            reason = self.account.check_pause()
            if reason is not None:
                self._report_pause(reason)
            if not self.account.may_start():
                self._update_clocks()
                return None
            key = self._resubmit.popleft() if self._resubmit else self.stream.next_key()
            number = self.account.started
            self.account.start()
            sample_id = self._next_id
            self._next_id += 1
            self.outstanding[sample_id] = key
            self._started_at[sample_id] = self.account.version
            self.in_flight += 1
            self._update_clocks()
            return sample_id, key, number

    def _report_pause(self, reason: PauseReason) -> None:
        """The first pause explained in full; later ones counted by :meth:`_summarize_pauses`
        (lock held)."""
        if self._pause_explained:
            logger.debug("rollouter paused at weight version %d", reason.version)
            return
        logger.info("%s", reason.message(self.cluster_mode))
        self._pause_explained = True
        self._pauses_reported = self.account.pauses

    def _summarize_pauses(self) -> None:
        """Every :data:`PAUSE_SUMMARY_STEPS` trainer steps, the pauses since the last line."""
        self._steps_taken += 1
        if self._steps_taken % PAUSE_SUMMARY_STEPS:
            return
        with self.lock:
            total, more = self.account.pauses, self.account.pauses - self._pauses_reported
            self._pauses_reported = total
        if more > 0:
            logger.info(
                "rollouter paused %d more %s at the staleness bound in the last %d steps (%d "
                "in all: fully_async/count/pauses)",
                more,
                "time" if more == 1 else "times",
                PAUSE_SUMMARY_STEPS,
                total,
            )

    async def _generate(self, sample_id: int, key: PromptKey, number: int) -> None:
        sample = None
        abandoned = False
        try:
            prompt = self.stream.prompt(key)
            if self.agents is not None:
                params = self.sampling_params(number)
                future = self.agents(prompt, params, _request_id(sample_id))
                [trajectories] = await asyncio.wrap_future(future)
                sample = Sample(sample_id, key, prompt, [], trajectories)
            else:
                sample = await self._sample(sample_id, key, prompt, number)
        except BaseException as exc:
            if not self._stopping and not isinstance(exc, asyncio.CancelledError):
                logger.error("the rollouter failed: %s", exc)
                self.error = exc
            raise
        finally:
            with self.lock:
                self.in_flight -= 1
                self._started_at.pop(sample_id, None)
                self._doomed.discard(sample_id)
                if sample is not None and not self._stopping:
                    oldest = sample.oldest_version
                    # it can never train: end it here and free its place under the bound
                    self.response_tokens += sample.response_tokens
                    abandoned = self.account.too_old(oldest)
                    if abandoned:
                        self.account.abandon(oldest)
                        self.outstanding.pop(sample_id, None)
                        self._dropped_lags.append(self.account.next_lag(oldest))
                    else:
                        self.account.finish()
                        if sample.newest_version != oldest:
                            self.partial_samples += 1
                self._update_clocks()
                self.lock.notify_all()
            self._notify()
        if abandoned:
            assert sample is not None
            logger.info(
                "ended sample %d while generating: its oldest token is of weight version %d, "
                "%d versions behind the trainer's next step, more than the bound of %d, so it "
                "could not train",
                sample_id,
                sample.oldest_version,
                self.account.next_lag(sample.oldest_version),
                self.account.version_lag_bound,
            )
        elif sample is not None and not self._stopping:
            await asyncio.get_running_loop().run_in_executor(None, self._hand_over, sample)

    async def _sample(self, sample_id: int, key: PromptKey, prompt: Batch, number: int) -> Sample:
        images = prompt[MULTIMODAL_COLUMN][0] if MULTIMODAL_COLUMN in prompt else None
        request = GenerationRequest(
            request_id=_request_id(sample_id),
            prompt_ids=prompt["raw_prompt_ids"][0],
            params=self.sampling_params(number),
            multi_modal_inputs=images,
            images=prompt[IMAGES_COLUMN][0] if IMAGES_COLUMN in prompt else (),
            videos=prompt[VIDEOS_COLUMN][0] if VIDEOS_COLUMN in prompt else (),
        )
        completions = await self.engines.agenerate(request)
        if self.partial == "abort" or sample_id in self._doomed:
            # ended by a weight sync, or aborted as too old: carry on unless it is
            completions = await self._continue_aborted(request, completions)
        return Sample(sample_id, key, prompt, in_prompt_order([completions]))

    def _hand_over(self, sample: Sample) -> None:
        if self.on_finished is not None:
            try:
                self.on_finished(sample)
            except Exception as exc:
                # scoring early only saves time: the trainer scores the sample when it takes
                # it, and a fault of the reward's surfaces there
                logger.warning("scoring sample %d early failed: %s", sample.sample_id, exc)
        self.buffer.put(sample)

    async def _continue_aborted(
        self, request: GenerationRequest, completions: list[Completion]
    ) -> list[Completion]:
        """Responses a weight sync aborted, continued after it with their tokens kept; not
        when the sample is already too old to train (it is dropped)."""
        if self.account.too_old(min(c.min_weight_version for c in completions)):
            return completions

        async def finish(completion: Completion) -> Completion:
            part = 0
            while (
                completion.finish_reason == "aborted"
                and not self._stopping
                and len(completion.token_ids) < request.params.max_tokens
                and not self.account.too_old(completion.min_weight_version)
            ):
                part += 1
                follow = continuation_request(
                    request,
                    completion,
                    request_id=f"{request.request_id}/{completion.sample_index}+{part}",
                )
                (rest,) = await self.engines.agenerate(follow)
                completion = join_completions(completion, rest)
            return completion

        return list(await asyncio.gather(*(finish(c) for c in completions)))

    # ------------------------------------------------------------------ the trainer's side

    def take(self, count: int) -> tuple[list[Sample], list[int]]:
        """Wait for ``count`` samples within the bound; returns them and the lags of the
        samples dropped meanwhile. Of the finished samples it has, the trainer takes those of
        the oldest weights first: they are the nearest to the bound. Fewer samples only when
        the rollouter has no more to give (``stop_after`` reached)."""
        taken: list[Sample] = []
        with self.lock:
            dropped, self._dropped_lags = self._dropped_lags, []
        while len(taken) < count:
            self.raise_if_failed()
            self._fetched.extend(self.buffer.get_all())
            if not self._fetched:
                waited = self.buffer.get(timeout=_POLL_S)
                if waited is None:
                    if self.exhausted():
                        break
                    continue
                self._fetched.append(waited)
            sample = min(self._fetched, key=lambda s: (s.oldest_version, s.sample_id))
            self._fetched.remove(sample)
            with self.lock:
                lag = self.account.lag(sample.oldest_version)
                kept = self.account.take(sample.oldest_version)
                self.outstanding.pop(sample.sample_id, None)
            self._notify()
            if kept:
                taken.append(sample)
            else:
                dropped.append(lag)
                self._log_drop(sample, lag)
        with self.lock:
            period_complete = self.account.period_complete
            strict = self.account.version_lag_bound is not None
        if period_complete and strict:
            # after the last take of a weight period the next one comes after a sync, so a
            # sample that would lag too much then is hopeless already: end it now, while the
            # trainer trains, and let a new sample take its place
            self._drop_hopeless()
        self._summarize_pauses()
        return taken, dropped

    def _log_drop(self, sample: Sample, lag: int) -> None:
        logger.info(
            "dropped a sample generated with weight version %d: %d versions behind, more "
            "than the bound of %d",
            sample.oldest_version,
            lag,
            self.account.version_lag_bound,
        )

    def _drop_too_old_fetched(self) -> None:
        """Finished samples too old to train are dropped at once, so that their places under
        the bound go to new samples now, not when the trainer reaches them (trainer's
        thread)."""
        self._fetched.extend(self.buffer.get_all())
        keep = []
        for sample in self._fetched:
            with self.lock:
                lag = self.account.next_lag(sample.oldest_version)
                too_old = self.account.too_old(sample.oldest_version)
                if too_old:
                    self.account.drop_finished(sample.oldest_version)
                    self.outstanding.pop(sample.sample_id, None)
                    self._dropped_lags.append(lag)
            if too_old:
                self._log_drop(sample, lag)
            else:
                keep.append(sample)
        self._fetched = keep

    def exhausted(self) -> bool:
        with self.lock:
            return (
                self.stop_after is not None
                and self.account.started >= self.stop_after
                and self.in_flight == 0
                and self.buffer.size() == 0
                and not self._fetched
            )

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if not self._thread.is_alive() and not self._stopping:
            raise RuntimeError("the rollouter thread ended unexpectedly")

    def sync(self, push: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Publish new weights with ``push`` (which gives the engines the next version);
        responses in flight are paused, aborted and continued, or waited for, by ``partial``."""
        if self.partial is None:
            with self.lock:
                self._holding = True
                self._update_clocks()
                while self.in_flight and self.error is None:
                    self.lock.wait(timeout=_POLL_S)
            self.raise_if_failed()
        try:
            if self.partial is not None:
                with self.lock:
                    self._engines_paused = True
                    self._update_clocks()
                self.engines.pause(self.partial)
            try:
                metrics = push()
            finally:
                if self.partial is not None:
                    self.engines.resume()
        finally:
            with self.lock:
                self._holding = self._engines_paused = False
                self.account.sync()
                doomed = self._too_old_in_flight()
                self._update_clocks()
                self.lock.notify_all()
            self._notify()
        self._drop_hopeless(doomed)
        return metrics

    def _drop_hopeless(self, doomed: list[int] | None = None) -> None:
        """End the samples that can no longer train (trainer's thread): abort those in
        flight, drop the finished ones; their places under the bound go to new samples now.
        Without a strict lag bound every sample may train: nothing to do."""
        if self.account.version_lag_bound is None:
            return
        if doomed is None:
            with self.lock:
                doomed = self._too_old_in_flight()
        if doomed:
            self.engines.abort([_request_id(sample_id) for sample_id in doomed])
        self._drop_too_old_fetched()
        self._notify()

    def _too_old_in_flight(self) -> list[int]:
        """Samples in flight sent with weights too old for the trainer's next take (lock
        held): their tokens are at least that old, so they are aborted, and end as dropped
        unless their first token came later than they were sent (then they continue). With
        ``partial="keep"`` only: ``"abort"`` ends everything at a sync and does not continue
        what is too old, and without partial rollout a sample in flight has only tokens of
        the current weights."""
        if self.partial != "keep" or not self.can_abort:
            return []
        doomed = [
            sample_id
            for sample_id, version in self._started_at.items()
            if sample_id not in self._doomed and self.account.too_old(version)
        ]
        self._doomed.update(doomed)
        return doomed

    # ------------------------------------------------------------------ what it did

    def _update_clocks(self) -> None:
        """Start or stop the idle and paused clocks after a change of state (lock held)."""
        now = time.monotonic()
        self._idle.turn(self.in_flight == 0 or self._engines_paused, now)
        self._paused.turn(self._holding or not self.account.may_start(), now)

    def idle_seconds(self) -> float:
        """Seconds so far with nothing for the engines to compute: no request of the
        rollouter's in flight, or the engines paused for a weight sync."""
        with self.lock:
            return self._idle.seconds(time.monotonic())

    def paused_seconds(self) -> float:
        """Seconds so far in which the rollouter started no sample: at the staleness bound, or
        holding for a weight sync."""
        with self.lock:
            return self._paused.seconds(time.monotonic())

    def snapshot(self) -> dict[str, Any]:
        """The state a checkpoint keeps: the counters, the data position, and the prompts of
        every sample not yet taken by the trainer (they are generated again on resume)."""
        with self.lock:
            return {
                "account": self.account.state_dict(),
                "prompts": [list(key) for key in (*self.outstanding.values(), *self._resubmit)],
                "dataloader": self.stream.state_dict(),
                "response_tokens": self.response_tokens,
            }


def _request_id(sample_id: int) -> str:
    return f"sample{sample_id}"


class _StateClock:
    """Seconds spent in a state that turns on and off."""

    def __init__(self, *, on: bool) -> None:
        self.total = 0.0
        self.since: float | None = time.monotonic() if on else None

    def turn(self, on: bool, now: float) -> None:
        if on and self.since is None:
            self.since = now
        elif not on and self.since is not None:
            self.total += now - self.since
            self.since = None

    def seconds(self, now: float) -> float:
        return self.total + (now - self.since if self.since is not None else 0.0)
