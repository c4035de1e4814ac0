"""The staleness bound of fully-async training as a pure class: no threads, no clocks, so that
the rule can be tested over any order of events.

Units are samples in verl's sense: one prompt with its ``rollout.n`` responses. The trainer
takes ``required_samples`` per step and publishes new weights (``version`` + 1) every
``trigger_parameter_sync_step`` steps, so one weight *period* trains ``samples_per_sync``
samples. The rollouter may start a sample while the samples it holds beyond what the trainer
takes before its next sync (``staleness_samples``) stay under ``max_required_samples``; it
pauses when they reach it and resumes once the trainer takes or syncs.

That is verl's rule, and by default the only one (``max_version_lag`` ``None``): every
finished sample trains, whatever its lag. If samples came back in the order they started, the
rule alone would keep every trained sample within ``ceil(max_required_samples /
samples_per_sync)`` versions of the trainer (:attr:`StalenessAccount.auto_version_lag`).
Responses end out of order (a long one can be overtaken by many short ones), so a long one may
lag more; its lag is measured and importance correction handles it.

A strict bound (``max_version_lag`` ``"auto"`` or a number of versions) also checks each
sample when the trainer takes it and drops (and counts) one whose oldest token is older than
the bound. A sample whose oldest token would be older than the bound at the trainer's next take
can never train (after the last take of a weight period, the next take comes after the sync),
so the rollouter may end it while it is still being generated (:meth:`abandon`) or drop it once
finished (:meth:`drop_finished`); either counts it as dropped and frees its place under the
bound for a sample that can train. Under either rule every sample that is started is trained
once, dropped once (only under a strict bound), or still outstanding.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs

UNBOUNDED = 2**62
"""``max_required_samples`` of a threshold too large to mean a bound."""

LagBound = int | Literal["auto"] | None
"""A value of ``scheduler.max_version_lag``: off, computed from the threshold, or versions."""


@attrs.frozen
class PauseReason:
    """Why the rollouter stopped starting samples: the numbers of the bound it hit."""

    staleness_samples: int
    max_required_samples: int
    required_samples: int
    staleness_threshold: float
    trigger_parameter_sync_step: int
    version: int

    def message(self, cluster_mode: str = "ray") -> str:
        """The pause explained, with the keys that make pauses rarer for a run of
        ``cluster_mode``: more trainer devices only on Ray (``cluster: local`` has one trainer
        rank in the driver)."""
        return (
            f"rollouter paused at weight version {self.version}: staleness_samples "
            f"{self.staleness_samples} >= max_required_samples {self.max_required_samples} "
            f"(= int(required_samples {self.required_samples} x (1 + staleness_threshold "
            f"{self.staleness_threshold:g}) x trigger_parameter_sync_step "
            f"{self.trigger_parameter_sync_step})); generation is ahead of training and waits "
            f"for the next weight sync. {fewer_pauses_advice(cluster_mode)}"
        )


def fewer_pauses_advice(cluster_mode: str) -> str:
    """What makes a trainer-bound run pause less, for a run of ``cluster_mode``."""
    if cluster_mode == "ray":
        return (
            "To pause less, raise scheduler.staleness_threshold (older samples) or give the "
            "trainer more devices (trainer.n_gpus_per_node)"
        )
    return (
        "To pause less, raise scheduler.staleness_threshold (older samples), or run on Ray "
        "to give the trainer devices of its own (cluster.mode=ray with trainer.n_gpus_per_node "
        "and rollout.n_gpus_per_node): with cluster.mode=local it trains in this process"
    )


@attrs.define
class StalenessAccount:
    """Counters of a fully-async run and the rule that bounds staleness.

    Events, in any order the run produces them: :meth:`start` (the rollouter sends a prompt;
    only when :meth:`may_start`), :meth:`finish` (its responses ended), :meth:`take` (the
    trainer takes it into a step: trained, or dropped when too old), :meth:`abandon` (instead
    of finish and take: it ended too old to train), :meth:`drop_finished` (instead of take:
    it finished too old to train), :meth:`sync` (the trainer published a new
    version). Samples are too old only under a strict bound (``max_version_lag`` not
    ``None``).
    """

    required_samples: int
    trigger_parameter_sync_step: int
    staleness_threshold: float
    max_version_lag: LagBound = attrs.field(default=None, kw_only=True)
    """``scheduler.max_version_lag``: ``None`` for verl's rule (nothing dropped for its age),
    ``"auto"`` for :attr:`auto_version_lag`, or a number of versions."""
    lag_bound_implied: bool = attrs.field(default=False, kw_only=True)
    """Whether :attr:`max_version_lag` is not the recipe's but what the checkpoint of an older
    plugrl implied (:func:`implied_lag_bound`); checkpoints keep it so for the rest of the
    run."""
    version: int = 0
    started: int = 0
    generated: int = 0
    trained: int = 0
    dropped: int = 0
    abandoned: int = 0
    """Of ``dropped``: samples ended while generating, already too old to train."""
    taken_this_period: int = 0
    """Samples trained since the last sync."""
    pauses: int = 0
    paused: bool = False

    def __attrs_post_init__(self) -> None:
        if self.required_samples < 1 or self.trigger_parameter_sync_step < 1:
            raise ValueError("required_samples and trigger_parameter_sync_step must be >= 1")
        if self.staleness_threshold < 0:
            raise ValueError("staleness_threshold must be >= 0")
        bound = self.max_version_lag
        if bound not in (None, "auto") and (
            not isinstance(bound, int) or isinstance(bound, bool) or bound < 1
        ):
            raise ValueError(f"max_version_lag must be None, 'auto' or >= 1, got {bound!r}")

    # ------------------------------------------------------------------------ the bound

    @property
    def samples_per_sync(self) -> int:
        """Samples the trainer trains with one weight version."""
        return self.required_samples * self.trigger_parameter_sync_step

    @property
    def max_required_samples(self) -> int:
        """verl's bound: ``int(required_samples x (1 + staleness_threshold) x
        trigger_parameter_sync_step)``; a threshold so large that the product is no longer a
        float gives :data:`UNBOUNDED` (the rollouter is never held back)."""
        product = (
            self.required_samples
            * (1 + self.staleness_threshold)
            * self.trigger_parameter_sync_step
        )
        return int(product) if product < UNBOUNDED else UNBOUNDED

    @property
    def auto_version_lag(self) -> int:
        """``ceil(max_required_samples / samples_per_sync)`` (1 for staleness 0: one-step
        off-policy): the most versions a trained sample lags when samples end in the order
        they started, and the strict bound ``max_version_lag: auto`` enforces."""
        return max(1, math.ceil(self.max_required_samples / self.samples_per_sync))

    @property
    def version_lag_bound(self) -> int | None:
        """The most versions a trained sample's oldest token may lag the trainer's version
        under the strict bound; ``None`` when it is off (verl's rule)."""
        if self.max_version_lag is None:
            return None
        if self.max_version_lag == "auto":
            return self.auto_version_lag
        return int(self.max_version_lag)

    @property
    def outstanding(self) -> int:
        """Samples started and neither trained nor dropped (in flight or waiting)."""
        return self.started - self.trained - self.dropped

    @property
    def staleness_samples(self) -> int:
        """Samples held beyond those the trainer takes before its next sync."""
        return self.outstanding - (self.samples_per_sync - self.taken_this_period)

    def may_start(self) -> bool:
        return self.staleness_samples < self.max_required_samples

    def pause_reason(self) -> PauseReason:
        return PauseReason(
            staleness_samples=self.staleness_samples,
            max_required_samples=self.max_required_samples,
            required_samples=self.required_samples,
            staleness_threshold=self.staleness_threshold,
            trigger_parameter_sync_step=self.trigger_parameter_sync_step,
            version=self.version,
        )

    def check_pause(self) -> PauseReason | None:
        """Whether the rollouter must wait now; the reason the first time it must since it
        last could start (one pause, one log line)."""
        if self.may_start():
            self.paused = False
            return None
        if self.paused:
            return None
        self.paused = True
        self.pauses += 1
        return self.pause_reason()

    # ------------------------------------------------------------------------ events

    def start(self) -> None:
        if not self.may_start():
            raise RuntimeError(
                f"a sample started while staleness_samples {self.staleness_samples} >= "
                f"max_required_samples {self.max_required_samples}"
            )
        self.started += 1

    def finish(self) -> None:
        if self.generated >= self.started:
            raise RuntimeError("a sample finished that never started")
        self.generated += 1

    def lag(self, oldest_version: int) -> int:
        """Versions between the trainer's and a sample's oldest token."""
        return self.version - oldest_version

    def take(self, oldest_version: int) -> bool:
        """The trainer takes a generated sample: ``True`` if it trains on it, ``False`` if it
        lags more than a strict :attr:`version_lag_bound` and is dropped."""
        if self.trained + self.dropped >= self.generated:
            raise RuntimeError("the trainer took a sample that was not generated")
        bound = self.version_lag_bound
        if bound is not None and self.lag(oldest_version) > bound:
            self.dropped += 1
            return False
        self.trained += 1
        self.taken_this_period += 1
        return True

    @property
    def period_complete(self) -> bool:
        """Whether the trainer has taken the last sample of this weight period: the sync is
        due before it takes another."""
        return self.taken_this_period >= self.samples_per_sync

    @property
    def next_take_version(self) -> int:
        """The trainer's version when it next takes a sample (one more once the period is
        complete: the sync comes first)."""
        return self.version + (1 if self.period_complete else 0)

    def next_lag(self, oldest_version: int) -> int:
        """A sample's lag at the trainer's next take."""
        return self.next_take_version - oldest_version

    def too_old(self, oldest_version: int) -> bool:
        """Whether a sample whose oldest token has ``oldest_version`` can no longer train: it
        would lag more than the strict bound at the trainer's next take (its lag only grows).
        Never without a strict bound."""
        bound = self.version_lag_bound
        return bound is not None and self.next_lag(oldest_version) > bound

    def _bound_text(self) -> str:
        bound = self.version_lag_bound
        return "no strict bound" if bound is None else f"bound {bound}"

    def _check_hopeless(self, oldest_version: int, what: str) -> None:
        if not self.too_old(oldest_version):
            raise RuntimeError(
                f"a sample of version {oldest_version} was {what} though it may still train "
                f"at version {self.next_take_version} ({self._bound_text()})"
            )

    def drop_finished(self, oldest_version: int) -> None:
        """A generated sample that is :meth:`too_old` is dropped before the trainer takes it
        (as :meth:`take` would have dropped it)."""
        if self.trained + self.dropped >= self.generated:
            raise RuntimeError("a sample was dropped that was not generated")
        self._check_hopeless(oldest_version, "dropped")
        self.dropped += 1

    def abandon(self, oldest_version: int) -> None:
        """The rollouter ended a started sample that is :meth:`too_old` to train; it counts as
        generated and dropped, and its place under the bound is free again."""
        if self.generated >= self.started:
            raise RuntimeError("a sample was abandoned that never started")
        self._check_hopeless(oldest_version, "abandoned")
        self.generated += 1
        self.dropped += 1
        self.abandoned += 1

    def sync(self) -> None:
        """The trainer published version ``version + 1`` to the engines."""
        self.version += 1
        self.taken_this_period = 0

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self, *, generated_kept: int = 0) -> dict[str, Any]:
        """What a checkpoint keeps. Samples outstanding now are generated again after a
        resume (their prompts are saved), so they count as not started; ``generated_kept`` is
        how many of the generated ones stay in the count (none: they are regenerated)."""
        return {
            "version": self.version,
            "started": self.trained + self.dropped,
            "generated": self.trained + self.dropped + generated_kept,
            "trained": self.trained,
            "dropped": self.dropped,
            "abandoned": self.abandoned,
            "taken_this_period": self.taken_this_period,
            "pauses": self.pauses,
            "max_version_lag": self.max_version_lag,
            "lag_bound_implied": self.lag_bound_implied,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in (
            "version",
            "started",
            "generated",
            "trained",
            "dropped",
            "taken_this_period",
            "pauses",
        ):
            setattr(self, name, int(state[name]))
        # checkpoints written before samples could be abandoned lack the count
        self.abandoned = int(state.get("abandoned", 0))
        self.paused = False
        # the rule stays the recipe's: the scheduler decides what a checkpoint without it
        # (written when the strict bound was the only rule) means, see implied_lag_bound


def implied_lag_bound(state: dict[str, Any]) -> LagBound:
    """The strict bound a checkpoint's account implies beyond its recipe: ``"auto"`` for one
    written by a plugrl whose only rule was that bound (no ``max_version_lag`` in it), the
    bound such a checkpoint passed on to a later one of the same run, else ``None`` (the
    recipe's ``max_version_lag`` holds)."""
    if "max_version_lag" not in state:
        return "auto"
    return state["max_version_lag"] if state.get("lag_bound_implied") else None
