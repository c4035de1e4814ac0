"""The rollouter against engines that only sleep: partial rollout by pausing, by aborting and
continuing, or by waiting; nothing lost, nothing taken twice; under verl's rule nothing dropped
for its age, under the strict bound nothing older than it trained."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from plugrl.parts.rollout import Capability, Completion, SamplingParams
from plugrl.plugin.manager import get_plugin_manager
from plugrl_fully_async.accounting import StalenessAccount
from plugrl_fully_async.buffer import LocalSampleBuffer
from plugrl_fully_async.rollouter import PAUSE_SUMMARY_STEPS, Rollouter, Sample

TOKEN_SECONDS = 0.0005
TRAIN_SECONDS = 0.01
PROMPT_LENGTH = 3


class SleepingEngines:
    """An engine group whose engine sleeps per token; each token carries the weight version.
    ``lengths`` gives each request its response length (long-tailed when asked)."""

    capabilities = frozenset({Capability.STREAM, Capability.ABORT, Capability.PAUSE_KEEP})

    def __init__(self, lengths) -> None:
        self.version = 0
        self.aborted_requests: set[str] = set()
        self.lengths = lengths
        self.paused: str | None = None
        self.aborts = 0
        self.resumed = threading.Event()
        self.resumed.set()
        self.in_flight = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()

    async def agenerate(self, request):
        with self.lock:
            self.in_flight += 1
            self.requests.append(request.request_id)
        try:
            return [await self._sample(request, index) for index in range(request.params.n)]
        finally:
            with self.lock:
                self.in_flight -= 1

    async def _sample(self, request, index):
        tokens, versions = [], []
        # a continuation's prompt holds the tokens so far: it ends where the whole would
        done = len(request.prompt_ids) - PROMPT_LENGTH
        length = min(self.lengths(request) - done, request.params.max_tokens)
        aborts = self.aborts
        while len(tokens) < length:
            await asyncio.sleep(TOKEN_SECONDS)
            if (self.aborts != aborts and tokens) or request.request_id in self.aborted_requests:
                return Completion(
                    token_ids=tokens,
                    log_probs=[-1.0] * len(tokens),
                    finish_reason="aborted",
                    token_versions=versions,
                    weight_version=self.version,
                    sample_index=index,
                )
            aborts = self.aborts
            if self.paused is not None:
                continue
            tokens.append(7)
            versions.append(self.version)
        return Completion(
            token_ids=tokens,
            log_probs=[-1.0] * len(tokens),
            finish_reason="length",
            token_versions=versions,
            weight_version=self.version,
            sample_index=index,
        )

    def pause(self, mode):
        self.paused = mode
        if mode == "abort":  # requests in flight end at once, requests sent meanwhile wait
            self.aborts += 1

    def resume(self):
        self.paused = None

    def abort_all(self):
        self.aborts += 1

    def abort(self, request_ids):
        self.aborted_requests.update(request_ids)

    def push(self):
        self.version += 1
        return {}


class Stream:
    def __init__(self) -> None:
        self.position = 0

    def next_key(self):
        self.position += 1
        return (0, self.position - 1)

    def prompt(self, key):
        return {"raw_prompt_ids": [[1, 2, key[1] % 50 + 3][:PROMPT_LENGTH]]}

    def state_dict(self):
        return {"epoch": 0, "position": self.position}


def keep_rollouter(engines, account, *, max_in_flight):
    """A rollouter with partial rollout by pause-keep, one response per prompt."""
    return Rollouter(
        engines=engines,
        account=account,
        stream=Stream(),
        buffer=LocalSampleBuffer(),
        sampling_params=lambda number: SamplingParams(n=1, max_tokens=40, seed=number),
        max_in_flight=max_in_flight,
        partial="keep",
    )


def run(
    partial,
    *,
    steps=8,
    required=3,
    sync_every=1,
    threshold=0.5,
    lengths=None,
    n=2,
    lag_bound=None,
):
    engines = SleepingEngines(lengths or (lambda request: 20))
    account = StalenessAccount(required, sync_every, threshold, max_version_lag=lag_bound)
    rollouter = Rollouter(
        engines=engines,
        account=account,
        stream=Stream(),
        buffer=LocalSampleBuffer(),
        sampling_params=lambda number: SamplingParams(n=n, max_tokens=40, seed=number),
        max_in_flight=8,
        partial=partial,
    )
    taken, dropped, in_flight_at_sync = [], [], []

    def push():
        in_flight_at_sync.append(engines.in_flight)
        return engines.push()

    rollouter.start()
    try:
        for step in range(1, steps + 1):
            samples, lags = rollouter.take(required)
            assert len(samples) == required
            if account.version_lag_bound is not None:
                for sample in samples:
                    assert account.version - sample.oldest_version <= account.version_lag_bound
            taken.extend(samples)
            dropped.extend(lags)
            time.sleep(TRAIN_SECONDS)  # the rollouter generates meanwhile
            if step % sync_every == 0:
                rollouter.sync(push)
    finally:
        rollouter.close()
    dropped.extend(rollouter.take(0)[1])  # samples ended too old after the last step
    ids = [sample.sample_id for sample in taken]
    assert len(set(ids)) == len(ids), "a sample was taken twice"
    with rollouter.lock:
        # every started sample is trained, dropped, or still outstanding: none lost
        assert account.trained == len(taken) and account.dropped == len(dropped)
        assert account.trained + account.dropped + len(rollouter.outstanding) == account.started
    return taken, dropped, in_flight_at_sync, engines, rollouter


def test_keep_pauses_responses_and_continues_them_with_the_new_weights():
    taken, _, in_flight_at_sync, _, rollouter = run("keep")
    spans = [sample.newest_version - sample.oldest_version for sample in taken]
    assert max(spans) >= 1, "no response was in flight at a sync"
    assert any(in_flight_at_sync)
    for sample in taken:
        for completion in sample.completions:
            assert len(completion.token_ids) == 20  # tokens kept across the sync
            assert completion.token_versions == sorted(completion.token_versions)
    assert rollouter.partial_samples >= 1


def test_abort_ends_responses_and_continues_them_keeping_their_tokens():
    taken, _, _, engines, _ = run("abort")
    continued = [request for request in engines.requests if "+" in request]
    assert continued, "no response was aborted and continued"
    spans = [sample.newest_version - sample.oldest_version for sample in taken]
    assert max(spans) >= 1
    for sample in taken:
        for completion in sample.completions:
            assert len(completion.token_ids) == 20
            assert completion.finish_reason == "length"
            assert completion.token_versions == sorted(completion.token_versions)


def test_without_partial_rollout_a_sync_waits_for_responses_in_flight():
    taken, _, in_flight_at_sync, _, _ = run(None)
    assert in_flight_at_sync == [0] * len(in_flight_at_sync)
    assert all(sample.newest_version == sample.oldest_version for sample in taken)


@pytest.mark.parametrize("partial", ["keep", None])
def test_long_tailed_responses_older_than_the_bound_are_dropped_and_counted(partial):
    def long_tail(request):
        # the same length for a request and its continuations
        sample = request.request_id.split("/")[0]
        return 40 if random.Random(sample).random() < 0.15 else 2

    _, dropped, _, _, rollouter = run(
        partial, steps=12, required=2, threshold=1.0, lengths=long_tail, n=1, lag_bound="auto"
    )
    bound = rollouter.account.version_lag_bound
    assert all(lag > bound for lag in dropped)
    if partial == "keep":
        assert dropped, "no long response was overtaken past the bound"


def test_responses_already_too_old_to_train_are_ended_while_generating():
    """With partial rollout a long response keeps generating across syncs; once its oldest
    token lags more than the bound it can never train, so the sync that makes it so aborts it,
    and it is dropped there instead of running to its end and holding a place under the
    bound meanwhile."""

    def long_tail(request):
        sample = request.request_id.split("/")[0]
        return 40 if random.Random(sample).random() < 0.15 else 2

    _, dropped, _, engines, rollouter = run(
        "keep", steps=12, required=2, threshold=1.0, lengths=long_tail, n=1, lag_bound="auto"
    )
    account = rollouter.account
    assert account.abandoned >= 1, "no response became too old while generating"
    assert engines.aborted_requests, "no request was aborted"
    assert account.abandoned <= account.dropped
    assert all(lag > account.version_lag_bound for lag in dropped)


@pytest.mark.parametrize("partial", ["keep", "abort", None])
def test_under_verls_rule_long_responses_train_whatever_their_lag(partial):
    """The workload that drops long responses under the strict bound: by default every
    finished sample trains, none is aborted for its age, and long ones lag more than the
    strict bound would have allowed."""

    def long_tail(request):
        sample = request.request_id.split("/")[0]
        return 40 if random.Random(sample).random() < 0.15 else 2

    taken, dropped, _, engines, rollouter = run(
        partial, steps=12, required=2, threshold=1.0, lengths=long_tail, n=1
    )
    account = rollouter.account
    assert dropped == [] and account.dropped == account.abandoned == 0
    assert not engines.aborted_requests
    for sample in taken:  # long responses kept every token
        assert len(sample.completions[0].token_ids) in (2, 40)
    if partial == "keep":
        lags = [account.version - sample.oldest_version for sample in taken]
        assert max(lags) > account.auto_version_lag, "no long response was overtaken"


def test_a_response_sent_just_before_a_sync_is_not_ended_for_its_send_version():
    """A request sent at version v whose first token comes after the sync has no token of
    version v: aborting it was a false alarm, so it continues and trains."""

    engines = SleepingEngines(lambda request: 3)
    account = StalenessAccount(1, 1, 0.0, max_version_lag="auto")
    rollouter = keep_rollouter(engines, account, max_in_flight=1)
    # the engine stays paused (it produces no token) through syncs that make the send
    # version too old
    engines.pause("keep")
    engines.resume = lambda: None
    rollouter.start()
    try:
        wait_until(lambda: engines.in_flight == 1)
        for _ in range(account.version_lag_bound + 1):
            rollouter.sync(engines.push)
        assert engines.aborted_requests == {"sample0"}
        SleepingEngines.resume(engines)
        samples, lags = rollouter.take(1)
    finally:
        rollouter.close()
    assert lags == [] and account.abandoned == 0
    (sample,) = samples
    (completion,) = sample.completions
    assert len(completion.token_ids) == 3 and completion.finish_reason == "length"
    assert set(completion.token_versions) == {account.version}


def test_a_rollouter_never_started_closes_quietly():
    """A resumed run that had already finished builds a rollouter and never starts it."""
    rollouter = Rollouter(
        engines=SleepingEngines(lambda request: 1),
        account=StalenessAccount(1, 1, 0.0),
        stream=Stream(),
        buffer=LocalSampleBuffer(),
        sampling_params=lambda number: SamplingParams(),
        max_in_flight=1,
        partial="keep",
    )
    rollouter.close()
    assert rollouter.account.started == 0


def wait_until(condition, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the rollouter did not get there in time"
        time.sleep(0.005)


def test_time_at_the_bound_and_time_with_nothing_to_compute_are_clocked():
    engines = SleepingEngines(lambda request: 20)
    account = StalenessAccount(2, 1, 0.0)
    rollouter = keep_rollouter(engines, account, max_in_flight=8)

    def at_the_bound_with_nothing_in_flight():
        with rollouter.lock:
            return not account.may_start() and rollouter.in_flight == 0

    rollouter.start()
    try:
        # nobody trains: the rollouter reaches the bound and its responses end
        wait_until(at_the_bound_with_nothing_in_flight)
        idle, paused = rollouter.idle_seconds(), rollouter.paused_seconds()
        time.sleep(0.2)
        assert rollouter.idle_seconds() - idle >= 0.2
        assert rollouter.paused_seconds() - paused >= 0.2

        # the trainer takes a step and syncs, the rollouter starts more; the next sync pauses
        # the engines with responses in flight, and they compute nothing while weights move
        rollouter.take(2)
        rollouter.sync(engines.push)
        wait_until(lambda: engines.in_flight > 0)
        idle = rollouter.idle_seconds()
        in_flight_at_push = []

        def slow_push():
            in_flight_at_push.append(engines.in_flight)
            time.sleep(0.2)
            return engines.push()

        rollouter.sync(slow_push)
        assert in_flight_at_push[0] > 0
        assert rollouter.idle_seconds() - idle >= 0.2
    finally:
        rollouter.close()


def finished_samples(account, versions):
    """Samples already generated, one per version in ``versions`` (oldest token)."""
    samples = []
    for sample_id, version in enumerate(versions):
        account.start()
        account.finish()
        completion = Completion(
            token_ids=[7, 7],
            log_probs=[-1.0, -1.0],
            finish_reason="stop",
            token_versions=[version, account.version],
            weight_version=account.version,
        )
        samples.append(Sample(sample_id, (0, sample_id), {}, [completion]))
    return samples


def idle_rollouter(account, buffer):
    """A rollouter that starts nothing (``stop_after=0``): the trainer's side alone."""
    rollouter = Rollouter(
        engines=SleepingEngines(lambda request: 1),
        account=account,
        stream=Stream(),
        buffer=buffer,
        sampling_params=lambda number: SamplingParams(),
        max_in_flight=1,
        partial="keep",
        stop_after=0,
    )
    rollouter.start()
    return rollouter


def test_the_trainer_takes_the_samples_of_the_oldest_weights_first():
    account = StalenessAccount(2, 1, 1.0)
    account.version = 2
    buffer = LocalSampleBuffer()
    samples = finished_samples(account, [2, 0, 1, 2])
    for sample in samples:
        buffer.put(sample)
    rollouter = idle_rollouter(account, buffer)
    try:
        first, _ = rollouter.take(2)
        second, _ = rollouter.take(2)
    finally:
        rollouter.close()
    assert [s.oldest_version for s in first] == [0, 1]
    assert [s.sample_id for s in second] == [0, 3]


def test_waiting_samples_too_old_after_a_sync_are_dropped_at_the_sync():
    account = StalenessAccount(2, 1, 1.0, max_version_lag="auto")
    account.version = 2
    buffer = LocalSampleBuffer()
    for sample in finished_samples(account, [0, 1, 2]):
        buffer.put(sample)
    rollouter = idle_rollouter(account, buffer)
    try:
        rollouter.sync(lambda: {})  # version 3: the sample of version 0 lags 3 > 2
        assert account.dropped == 1 and account.outstanding == 2
        taken, dropped = rollouter.take(2)
    finally:
        rollouter.close()
    assert dropped == [3]
    assert [s.oldest_version for s in taken] == [1, 2]


def test_under_verls_rule_waiting_samples_are_kept_across_syncs_and_train_oldest_first():
    account = StalenessAccount(2, 1, 1.0)
    account.version = 2
    buffer = LocalSampleBuffer()
    for sample in finished_samples(account, [0, 1, 2]):
        buffer.put(sample)
    rollouter = idle_rollouter(account, buffer)
    try:
        rollouter.sync(lambda: {})  # version 3: the sample of version 0 lags 3
        assert account.dropped == 0 and account.outstanding == 3
        taken, dropped = rollouter.take(2)
    finally:
        rollouter.close()
    assert dropped == []
    assert [account.version - s.oldest_version for s in taken] == [3, 2]


# ------------------------------------------------------------------------------ the pause line


def pause_three_times(rollouter, account):
    """Start samples until the bound holds the rollouter back, then let the trainer take the
    period and sync; three times."""
    for _ in range(3):
        while rollouter._try_start() is not None:
            pass
        for _ in range(account.samples_per_sync):
            account.finish()
            account.take(account.version)
        account.sync()
    assert account.pauses == 3


@pytest.mark.parametrize(
    "cluster_mode, advice",
    [
        (
            None,  # engines without a recipe: one process
            "To pause less, raise scheduler.staleness_threshold (older samples), or run on Ray "
            "to give the trainer devices of its own (cluster.mode=ray with "
            "trainer.n_gpus_per_node and rollout.n_gpus_per_node): with cluster.mode=local it "
            "trains in this process",
        ),
        (
            "ray",
            "To pause less, raise scheduler.staleness_threshold (older samples) or give the "
            "trainer more devices (trainer.n_gpus_per_node)",
        ),
    ],
)
def test_the_first_pause_is_explained_for_the_runs_cluster_and_later_ones_counted(
    caplog, cluster_mode, advice
):
    import logging

    account = StalenessAccount(2, 1, 0.0)
    rollouter = Rollouter(
        engines=SleepingEngines(lambda request: 1),
        account=account,
        stream=Stream(),
        buffer=LocalSampleBuffer(),
        sampling_params=lambda number: SamplingParams(n=1, max_tokens=4, seed=number),
        max_in_flight=100,
        partial="keep",
        cluster_mode=cluster_mode,
    )
    with caplog.at_level(logging.INFO, logger="plugrl.run"):
        pause_three_times(rollouter, account)
        for _ in range(2 * PAUSE_SUMMARY_STEPS):  # trainer steps
            rollouter._summarize_pauses()
    assert caplog.messages == [
        "rollouter paused at weight version 0: staleness_samples 2 >= max_required_samples 2 "
        "(= int(required_samples 2 x (1 + staleness_threshold 0) x trigger_parameter_sync_step "
        f"1)); generation is ahead of training and waits for the next weight sync. {advice}",
        f"rollouter paused 2 more times at the staleness bound in the last {PAUSE_SUMMARY_STEPS} "
        "steps (3 in all: fully_async/count/pauses)",
    ]


def test_a_rollouter_takes_the_cluster_mode_of_its_engines_recipe():
    from plugrl.recipe import build_recipe

    engines = SleepingEngines(lambda request: 1)
    engines.recipe = build_recipe({"cluster": "ray"}, get_plugin_manager())
    rollouter = keep_rollouter(engines, StalenessAccount(2, 1, 0.0), max_in_flight=4)
    assert rollouter.cluster_mode == "ray"


def test_each_sample_is_handed_over_before_the_buffer_and_a_failing_hand_over_is_logged(caplog):
    engines = SleepingEngines(lambda request: 5)
    account = StalenessAccount(2, 1, 0.5)
    handed: list[int] = []

    def on_finished(sample):
        handed.append(sample.sample_id)
        if sample.sample_id == 1:
            raise RuntimeError("the reward manager is closed")

    rollouter = Rollouter(
        engines=engines,
        account=account,
        stream=Stream(),
        buffer=LocalSampleBuffer(),
        sampling_params=lambda number: SamplingParams(n=1, max_tokens=40, seed=number),
        max_in_flight=2,
        partial=None,
        on_finished=on_finished,
    )
    rollouter.start()
    try:
        with caplog.at_level("WARNING", logger="plugrl.run"):
            samples, _ = rollouter.take(2)
            message = "scoring sample 1 early failed: the reward manager is closed"
            wait_until(lambda: message in caplog.messages)
    finally:
        rollouter.close()
    # the trainer takes a sample only once it was handed over, a failed hand-over included
    assert {sample.sample_id for sample in samples} <= set(handed)
