"""The staleness rules of the fully-async scheduler, over random orders of events: verl's rule
(the default: the bound applies when a sample starts, nothing finished is dropped for age) and
the strict bound (``max_version_lag``: no trained sample lags more)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrl_fully_async.accounting import StalenessAccount, implied_lag_bound


class Simulation:
    """A rollouter with ``max_in_flight`` requests, responses ending in a random order, and a
    trainer taking ``required`` samples per step and syncing every ``sync_every`` steps.
    A sample's oldest token is the version at its start (partial rollout keeps it)."""

    def __init__(self, account: StalenessAccount, max_in_flight: int, seed: int) -> None:
        self.account = account
        self.max_in_flight = max_in_flight
        self.random = random.Random(seed)
        self.next_id = 0
        self.in_flight: dict[int, int] = {}  # id -> version at start
        self.buffer: list[tuple[int, int]] = []
        self.trained: list[int] = []
        self.dropped: list[int] = []
        self.step_samples: list[tuple[int, int]] = []
        self.steps = 0
        self.sync_due = False
        self.lags: list[int] = []

    def start(self) -> bool:
        if len(self.in_flight) >= self.max_in_flight or not self.account.may_start():
            return False
        self.account.start()
        self.in_flight[self.next_id] = self.account.version
        self.next_id += 1
        return True

    def finish(self, fifo: bool) -> bool:
        if not self.in_flight:
            return False
        ids = sorted(self.in_flight)
        sample_id = ids[0] if fifo else self.random.choice(ids)
        self.buffer.append((sample_id, self.in_flight.pop(sample_id)))
        self.account.finish()
        return True

    def abandon(self) -> bool:
        """The rollouter ends a sample in flight that is already too old to train."""
        stale = [i for i, version in self.in_flight.items() if self.account.too_old(version)]
        if not stale:
            return False
        sample_id = self.random.choice(stale)
        self.account.abandon(self.in_flight.pop(sample_id))
        self.dropped.append(sample_id)
        return True

    def drop_finished(self) -> bool:
        """The trainer drops a finished sample it will not reach in time."""
        stale = [i for i, (_, version) in enumerate(self.buffer) if self.account.too_old(version)]
        if not stale:
            return False
        sample_id, version = self.buffer.pop(self.random.choice(stale))
        self.account.drop_finished(version)
        self.dropped.append(sample_id)
        return True

    def sync(self) -> bool:
        if not self.sync_due:
            return False
        self.account.sync()
        self.sync_due = False
        return True

    def take(self) -> bool:
        if self.sync_due:
            self.sync()
        if not self.buffer:
            return False
        sample_id, version = self.buffer.pop(0)
        lag = self.account.lag(version)
        if self.account.take(version):
            bound = self.account.version_lag_bound
            assert bound is None or lag <= bound
            self.trained.append(sample_id)
            self.lags.append(lag)
            self.step_samples.append((sample_id, version))
            if len(self.step_samples) == self.account.required_samples:
                self.steps += 1
                self.step_samples = []
                # the trainer trains before it syncs: other roles act meanwhile
                self.sync_due = self.steps % self.account.trigger_parameter_sync_step == 0
        else:
            assert lag > self.account.version_lag_bound
            self.dropped.append(sample_id)
        return True

    def check_conservation(self) -> None:
        account = self.account
        buffered = [sample_id for sample_id, _ in self.buffer]
        everything = [*self.trained, *self.dropped, *buffered, *self.in_flight]
        assert sorted(everything) == list(range(self.next_id)), "a sample lost or counted twice"
        assert account.started == self.next_id
        assert account.generated == len(self.trained) + len(self.dropped) + len(buffered)
        assert (account.trained, account.dropped) == (len(self.trained), len(self.dropped))


bounds = st.tuples(
    st.integers(1, 6),  # required samples
    st.integers(1, 4),  # trigger_parameter_sync_step
    st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0]),
    st.integers(1, 24),  # in flight at most
    st.integers(0, 2**32 - 1),
)


def strict(required, sync_every, threshold, bound="auto"):
    """An account under the strict bound (``scheduler.max_version_lag``)."""
    return StalenessAccount(required, sync_every, threshold, max_version_lag=bound)


@settings(max_examples=80, deadline=None)
@given(
    bounds,
    st.sampled_from(["auto", 1, 2, 3]),
    st.lists(st.integers(0, 5), min_size=50, max_size=600),
)
def test_no_trained_sample_lags_more_than_the_bound_and_none_is_lost(bound, lag_bound, events):
    required, sync_every, threshold, in_flight, seed = bound
    account = strict(required, sync_every, threshold, lag_bound)
    simulation = Simulation(account, in_flight, seed)
    for event in events:
        # a random timing: whichever role acts next, if it can (3 and 4: a sample too old
        # for the trainer's next take is ended in flight, or dropped once finished)
        actions = [
            simulation.start,
            lambda: simulation.finish(fifo=False),
            simulation.take,
            simulation.abandon,
            simulation.drop_finished,
            simulation.sync,
        ]
        actions[event]()
        assert account.outstanding >= 0
        simulation.check_conservation()
    assert all(lag <= account.version_lag_bound for lag in simulation.lags)
    assert account.abandoned <= account.dropped


def test_only_a_sample_too_old_to_train_can_be_abandoned():
    account = strict(2, 1, 0.0)
    account.start()
    with pytest.raises(RuntimeError, match="may still train"):
        account.abandon(0)
    account.sync()
    account.sync()
    account.abandon(0)
    assert (account.generated, account.dropped, account.abandoned, account.outstanding) == (
        1,
        1,
        1,
        0,
    )
    with pytest.raises(RuntimeError, match="never started"):
        account.abandon(0)


def test_only_a_finished_sample_too_old_to_train_can_be_dropped_before_it_is_taken():
    account = strict(1, 1, 0.0)
    with pytest.raises(RuntimeError, match="was dropped that was not generated"):
        account.drop_finished(0)
    account.start()
    account.finish()
    with pytest.raises(RuntimeError, match="was dropped though it may still train at version 0"):
        account.drop_finished(0)
    account.sync()
    account.sync()
    account.drop_finished(0)
    assert (account.dropped, account.abandoned, account.outstanding) == (1, 0, 0)


@settings(max_examples=50, deadline=None)
@given(bounds, st.sampled_from([None, "auto", 1]))
def test_the_run_never_deadlocks(bound, lag_bound):
    """Whatever the order, the trainer always gets its next step: the rollouter may start
    while the trainer lacks samples for its weight period."""
    required, sync_every, threshold, in_flight, seed = bound
    simulation = Simulation(strict(required, sync_every, threshold, lag_bound), in_flight, seed)
    rng = random.Random(seed)
    for _ in range(2000):
        acted = [simulation.start, lambda: simulation.finish(fifo=False), simulation.take]
        rng.shuffle(acted)
        if not any(action() for action in acted):
            pytest.fail(f"no role can act after {simulation.steps} steps")
    assert simulation.steps >= 10


@settings(max_examples=50, deadline=None)
@given(bounds, st.lists(st.integers(0, 2), min_size=50, max_size=600))
def test_samples_returned_in_start_order_are_never_dropped(bound, events):
    """The pause rule alone keeps the bound when responses end in the order they started;
    drops only happen to responses that were overtaken."""
    required, sync_every, threshold, in_flight, seed = bound
    simulation = Simulation(strict(required, sync_every, threshold), in_flight, seed)
    for event in events:
        [simulation.start, lambda: simulation.finish(fifo=True), simulation.take][event]()
    assert simulation.dropped == []
    assert all(lag <= simulation.account.auto_version_lag for lag in simulation.lags)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.integers(1, 32), st.integers(0, 2**32 - 1))
def test_staleness_0_with_sync_step_1_is_one_step_off_policy(required, in_flight, seed):
    account = StalenessAccount(required, 1, 0.0)
    assert account.max_required_samples == required
    assert account.auto_version_lag == 1
    simulation = Simulation(account, max(in_flight, 2 * required), seed)
    rng = random.Random(seed)
    for _ in range(1500):
        acted = [simulation.start, lambda: simulation.finish(fifo=True), simulation.take]
        rng.shuffle(acted)
        any(action() for action in acted)
    assert set(simulation.lags) <= {0, 1}
    assert simulation.dropped == []


def test_staleness_0_generates_the_next_step_while_the_trainer_trains():
    """One-step off-policy: while the trainer trains on version 0's samples, the rollouter
    generates exactly one step more with version 0; they are trained with version 1."""
    account = StalenessAccount(3, 1, 0.0)
    for _ in range(3):
        account.start()
        account.finish()
    for _ in range(3):
        assert account.take(0)
    started_while_training = 0
    while account.may_start():
        account.start()
        started_while_training += 1
    assert started_while_training == 3
    account.sync()  # the step's weights are version 1
    for _ in range(3):
        account.finish()
        assert account.lag(0) == 1
        assert account.take(0)


def test_the_bound_is_verls_formula():
    account = StalenessAccount(64, 4, 0.2)
    assert account.max_required_samples == 307  # the seeds' run: 64 x 1.2 x 4
    assert account.samples_per_sync == 256
    assert account.auto_version_lag == 2
    assert StalenessAccount(4, 1, 0.5).auto_version_lag == 2
    assert StalenessAccount(4, 1, 1.0).auto_version_lag == 2
    assert StalenessAccount(4, 1, 1.25).auto_version_lag == 3  # int(4 x 2.25) = 9 > 8
    # the strict bound: off by default, auto, or a number of versions
    assert account.version_lag_bound is None
    assert strict(64, 4, 0.2).version_lag_bound == 2
    assert strict(64, 4, 0.2, 5).version_lag_bound == 5


def test_a_pause_is_counted_once_and_names_the_key_to_change():
    account = StalenessAccount(2, 1, 0.0)
    reasons = []
    while True:
        reason = account.check_pause()
        if reason is not None:
            reasons.append(reason)
            break
        account.start()
    assert account.started == 4  # one period being trained plus one ahead
    assert account.check_pause() is None and account.pauses == 1
    message = reasons[0].message()
    assert "staleness_samples 2 >= max_required_samples 2" in message
    assert "scheduler.staleness_threshold" in message
    for _ in range(2):
        account.finish()
        account.take(0)
    assert account.check_pause() is not None or account.paused  # still ahead until a sync
    account.sync()
    assert account.check_pause() is None and not account.paused
    account.start()
    account.start()
    assert account.check_pause() is not None and account.pauses == 2


def test_a_checkpoint_keeps_the_counters_and_regenerates_what_was_outstanding():
    account = strict(2, 2, 0.5)
    simulation = Simulation(account, 8, seed=3)
    rng = random.Random(3)
    for _ in range(300):
        rng.choice([simulation.start, lambda: simulation.finish(fifo=False), simulation.take])()
    state = account.state_dict()
    assert implied_lag_bound(state) is None  # the recipe's max_version_lag holds on resume
    resumed = strict(2, 2, 0.5)
    resumed.load_state_dict(state)
    assert (resumed.version, resumed.trained, resumed.dropped) == (
        account.version,
        account.trained,
        account.dropped,
    )
    assert resumed.taken_this_period == account.taken_this_period
    assert resumed.outstanding == 0  # the outstanding prompts are sent again
    assert resumed.generated == resumed.trained + resumed.dropped
    # resending them all stays within the bound the original run had
    for _ in range(account.outstanding):
        assert resumed.may_start()
        resumed.start()


def test_events_out_of_order_are_refused():
    account = StalenessAccount(1, 1, 0.0)
    with pytest.raises(RuntimeError, match="never started"):
        account.finish()
    account.start()
    with pytest.raises(RuntimeError, match="not generated"):
        account.take(0)
    account.start()
    with pytest.raises(RuntimeError, match="max_required_samples"):
        account.start()


def test_a_threshold_too_large_for_a_bound_leaves_the_rollouter_unbounded():
    from plugrl_fully_async.accounting import UNBOUNDED

    account = StalenessAccount(4, 1, 1e308)  # finite, but 4 x (1 + 1e308) is not
    assert account.max_required_samples == UNBOUNDED
    assert account.may_start()


# ------------------------------------------------------------------ verl's rule, the default


@settings(max_examples=80, deadline=None)
@given(bounds, st.lists(st.integers(0, 3), min_size=50, max_size=600))
def test_under_verls_rule_nothing_finished_is_dropped_and_none_is_lost(bound, events):
    """Responses ending in any order, the trainer taking and syncing at random: every sample
    the trainer takes trains, whatever its lag, and every started sample is trained, waiting
    or in flight."""
    required, sync_every, threshold, in_flight, seed = bound
    account = StalenessAccount(required, sync_every, threshold)
    assert account.version_lag_bound is None
    simulation = Simulation(account, in_flight, seed)
    for event in events:
        actions = [
            simulation.start,
            lambda: simulation.finish(fifo=False),
            simulation.take,
            simulation.sync,
        ]
        actions[event]()
        simulation.check_conservation()
        # no sample is ever too old: nothing in flight or waiting can be ended for its age
        versions = [*simulation.in_flight.values(), *(v for _, v in simulation.buffer)]
        assert not any(account.too_old(version) for version in versions)
    assert simulation.dropped == [] and account.dropped == account.abandoned == 0
    assert account.trained == len(simulation.lags)


@settings(max_examples=80, deadline=None)
@given(bounds, st.lists(st.integers(0, 3), min_size=50, max_size=600))
def test_under_verls_rule_the_rollouter_never_starts_more_than_max_required_samples_ahead(
    bound, events
):
    """``staleness_samples`` (samples held beyond what the trainer takes before its next
    sync) never exceeds ``max_required_samples``, and the rollouter starts whenever it is
    below it."""
    required, sync_every, threshold, in_flight, seed = bound
    account = StalenessAccount(required, sync_every, threshold)
    simulation = Simulation(account, in_flight, seed)
    for event in events:
        below = account.staleness_samples < account.max_required_samples
        room = len(simulation.in_flight) < in_flight
        started = [
            simulation.start,
            lambda: simulation.finish(fifo=False),
            simulation.take,
            simulation.sync,
        ][event]()
        if event == 0:
            assert started == (below and room)
        assert account.staleness_samples <= account.max_required_samples
        assert account.outstanding <= account.max_required_samples + account.samples_per_sync


def test_under_verls_rule_a_long_response_trains_however_far_it_lags():
    """A response overtaken by many periods of short ones lags more than the strict bound
    would allow; under verl's rule it trains, and its lag is what the trainer measures."""
    for lag_bound, trains in ((None, True), ("auto", False)):
        account = StalenessAccount(1, 1, 0.0, max_version_lag=lag_bound)
        account.start()  # the long one, at version 0
        account.finish()  # it ends ...
        for _ in range(3):  # ... after three periods of short ones have trained
            account.start()
            account.finish()
            assert account.take(account.version)
            account.sync()
        assert account.lag(0) == 3 > account.auto_version_lag
        assert account.too_old(0) is not trains
        assert account.take(0) is trains
        assert account.dropped == (0 if trains else 1)


def test_under_verls_rule_nothing_can_be_ended_or_dropped_for_its_age():
    account = StalenessAccount(1, 1, 0.0)
    account.start()
    for _ in range(5):
        account.sync()
    with pytest.raises(RuntimeError, match=r"may still train at version 5 \(no strict bound\)"):
        account.abandon(0)
    account.finish()
    with pytest.raises(RuntimeError, match="may still train"):
        account.drop_finished(0)


@pytest.mark.parametrize("value", [0, -1, "soon", 1.5, True])
def test_a_strict_bound_that_is_not_auto_or_a_positive_number_is_refused(value):
    with pytest.raises(ValueError, match="max_version_lag must be None, 'auto' or >= 1, got "):
        StalenessAccount(1, 1, 0.0, max_version_lag=value)


def test_a_checkpoint_keeps_its_rule_and_one_of_an_older_plugrl_implies_the_strict_bound():
    for lag_bound in (None, "auto", 3):
        state = StalenessAccount(2, 1, 0.5, max_version_lag=lag_bound).state_dict()
        assert state["max_version_lag"] == lag_bound
        assert implied_lag_bound(state) is None
    older = StalenessAccount(2, 1, 0.5).state_dict()
    del older["max_version_lag"]  # written when the strict bound was the only rule
    del older["lag_bound_implied"]
    assert implied_lag_bound(older) == "auto"
    # the run resumed from it keeps the bound in its own checkpoints
    resumed = StalenessAccount(2, 1, 0.5, max_version_lag="auto", lag_bound_implied=True)
    assert implied_lag_bound(resumed.state_dict()) == "auto"
