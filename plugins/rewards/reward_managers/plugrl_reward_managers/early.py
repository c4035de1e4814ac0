"""Scoring responses while others still generate: what :meth:`RewardManager.prefetch` starts,
and how the later call on the whole batch finds it.

Prefetched samples wait in a queue; one scoring thread takes every sample queued so far,
scores them as one run of a worker pool (a pool takes one run at a time), and takes the next
lot. The results are kept by content (data source, decoded response, ground truth,
extra_info): the batch's call takes, for each of its rows, one result of the same content,
whatever order the rows come in, scores the rest itself, then waits for those still being
scored early. Where the early runs have a pool of their own (the ``parallel`` manager) the
batch's rest is scored while the early run goes on; otherwise the two take turns. A result is
taken once, so a response that appears twice is scored twice, as without prefetch.

Results nobody takes (a fully-async rollouter prefetches samples the trainer later drops)
are forgotten after :data:`FORGET_AFTER_CALLS` batches; a row whose result was forgotten is
scored by its batch's call, so forgetting costs time, never a different score.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

logger = logging.getLogger("plugrl.rewards")

Result = TypeVar("Result")

FORGET_AFTER_CALLS = 16
"""Batches a prefetched result waits to be taken before it is dropped. A fully-async trainer
takes samples a few steps after they finish at most (the staleness bound drops older ones)."""


def content_key(sample: dict[str, Any]) -> bytes | None:
    """What identifies a sample's score: its four scoring arguments, pickled (they are sent
    to worker processes pickled anyway); ``None`` for one that does not pickle."""
    try:
        return pickle.dumps(
            (
                sample["data_source"],
                sample["solution_str"],
                sample["ground_truth"],
                sample["extra_info"],
            ),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except Exception:
        return None


@attrs.define(eq=False)
class _Entry:
    sample: dict[str, Any]
    key: bytes
    state: str = "queued"  # queued | scoring | done | failed
    result: Any = None
    batches_seen: int = 0


class EarlyScores:
    """Samples prefetched, scored on a thread of their own by ``score`` (a list of samples in,
    one result per sample out), until a batch's call takes them (:meth:`results_for`)."""

    def __init__(self, score: Callable[[list[dict[str, Any]]], list[Any]], name: str) -> None:
        self._score = score
        self._name = name
        self._changed = threading.Condition()
        self._queue: list[_Entry] = []
        self._by_key: dict[bytes, list[_Entry]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, samples: Sequence[dict[str, Any]]) -> None:
        """Queue ``samples`` for the scoring thread (started on first use); returns at once."""
        with self._changed:
            if self._stopping:
                return
            for sample in samples:
                key = content_key(sample)
                if key is None:
                    continue  # its batch's call scores it
                entry = _Entry(sample, key)
                self._queue.append(entry)
                self._by_key.setdefault(key, []).append(entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name=f"plugrl-reward-{self._name}-early", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def pending(self) -> int:
        """Samples prefetched and not yet taken by a batch (queued, being scored, or done)."""
        with self._changed:
            return sum(len(entries) for entries in self._by_key.values())

    def unscored(self) -> int:
        """Samples prefetched and not yet scored (queued, or being scored now)."""
        with self._changed:
            return sum(
                entry.state in ("queued", "scoring")
                for entries in self._by_key.values()
                for entry in entries
            )

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._stopping and not self._queue:
                    self._changed.wait()
                if self._stopping:
                    return
                entries, self._queue = self._queue, []
                for entry in entries:
                    entry.state = "scoring"
            try:
                results: list[Any] | None = self._score([e.sample for e in entries])
            except BaseException as exc:
                # the batch's call scores these samples itself and meets the error there,
                # where it stops the run as it would have without prefetch
                logger.debug("reward: scoring %d samples early failed: %s", len(entries), exc)
                results = None
            with self._changed:
                for index, entry in enumerate(entries):
                    if results is None:
                        entry.state = "failed"
                    else:
                        entry.state, entry.result = "done", results[index]
                self._changed.notify_all()

    def results_for(
        self,
        samples: Sequence[dict[str, Any]],
        score: Callable[[list[dict[str, Any]]], list[Result]],
    ) -> tuple[list[Result], int]:
        """One result per sample, in order: a prefetched one of the same content where there
        is one (waiting for it if it is being scored), else scored now by ``score``; and how
        many were scored before this call."""
        with self._changed:
            taken = [self._take(content_key(sample)) for sample in samples]
            ready = sum(entry is not None and entry.state == "done" for entry in taken)
        try:
            results: list[Any] = [None] * len(samples)
            self._score_into(results, samples, [i for i, e in enumerate(taken) if e is None], score)
            with self._changed:
                while any(entry is not None and entry.state == "scoring" for entry in taken):
                    self._changed.wait()
            for index, entry in enumerate(taken):
                if entry is not None and entry.state == "done":
                    results[index] = entry.result
            # samples whose early run failed: scored again here, where the failure surfaces
            self._score_into(
                results, samples, [i for i, r in enumerate(results) if r is None], score
            )
        finally:
            with self._changed:
                self._forget_old()
        return results, ready

    @staticmethod
    def _score_into(
        results: list[Any],
        samples: Sequence[dict[str, Any]],
        indices: list[int],
        score: Callable[[list[dict[str, Any]]], list[Any]],
    ) -> None:
        if indices:
            scored = score([samples[i] for i in indices])
            for index, result in zip(indices, scored, strict=True):
                results[index] = result

    def _take(self, key: bytes | None) -> _Entry | None:
        """The best entry of ``key`` (done, else being scored), removed from the cache; a
        queued one is taken off the queue and left to the caller (lock held)."""
        entries = self._by_key.get(key) if key is not None else None
        if not entries:
            return None
        rank = {"done": 0, "scoring": 1, "failed": 2, "queued": 3}
        entry = min(entries, key=lambda e: rank[e.state])
        entries.remove(entry)
        if not entries:
            del self._by_key[entry.key]
        if entry.state == "queued":
            self._queue.remove(entry)
            return None
        return entry if entry.state != "failed" else None

    def _forget_old(self) -> None:
        """Drop scored results no batch took in :data:`FORGET_AFTER_CALLS` batches (lock
        held)."""
        for key in list(self._by_key):
            entries = self._by_key[key]
            for entry in entries:
                entry.batches_seen += 1
            kept = [
                e
                for e in entries
                if e.state in ("queued", "scoring") or e.batches_seen <= FORGET_AFTER_CALLS
            ]
            if kept:
                self._by_key[key] = kept
            else:
                del self._by_key[key]

    def close(self) -> None:
        """Stop the scoring thread once its current run ends; queued samples are dropped."""
        with self._changed:
            self._stopping = True
            self._queue.clear()
            self._by_key.clear()
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
