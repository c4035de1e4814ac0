"""The built-in reward managers: ``naive``, ``dapo``, ``batch`` and ``parallel``.

Every manager decodes each response's valid tokens, scores them with the function its data
source resolves to, and puts the score on the response's last valid token. Scoring always runs
in worker processes (:mod:`plugrl.rewards.workers`) so ``reward.timeout_s`` holds
even for a scorer that never returns.

Failures: a timeout is scored 0 and counted in ``reward/timeouts``. A scorer that raises (or
returns something that is not a score, or whose process dies) stops the run with the data
source, sample index and exception named (``reward.on_error: raise``), or is scored 0 and
counted in ``reward/errors`` (``score_zero``), or scored ``reward.fallback_score``
(``fallback``, which scores timeouts so too).

Metrics: ``critic/score/{mean,max,min}`` (per-response totals, shaping included),
``reward/<data_source>/score`` (mean raw score), ``reward/<data_source>/<field>`` (mean of each
numeric field a scorer returns, ``acc`` included; a failed sample counts as ``acc`` 0),
``reward/errors`` and ``reward/timeouts``; and, measured on the machine,
``perf/reward_workers`` (worker processes after the batch), ``perf/reward_busy_fraction``
(the share of the scoring calls' time since the last batch spent computing or waiting for a
core: near 0 for a scorer that waits on I/O or sleeps) and ``perf/reward_prefetched`` (the
share of the batch's responses already scored when the batch came).

Every manager scores early (:meth:`ScoringRewardManager.prefetch`): responses handed over
while others still generate are scored on a thread of the manager's own
(:mod:`plugrl_reward_managers.early`; ``parallel`` in a second pool, the others in their one
worker, taking turns with the batch's call), and the batch's call takes their results. The
``batch`` manager then calls a batch-form function on the responses finished together rather
than on the whole batch: a function whose scores depend on other rows of the batch needs
``reward.overlap: false``.

A batch whose scoring took over a second, its calls mostly waiting, with no more workers to
give, logs once which key would score more samples at a time.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from plugrl.api import RecipeError, non_negative, option, positive, section
from plugrl.api.data import Batch, response_attention_mask
from plugrl.api.rewards import (
    Call,
    Outcome,
    ProcessPool,
    RewardConfig,
    RewardManager,
    RewardOutput,
    SampleResult,
    Scorer,
    ScoringError,
    expect_config,
    extra_columns,
    score_metrics,
)

from .early import EarlyScores

if TYPE_CHECKING:
    from plugrl.api import PartContext

logger = logging.getLogger("plugrl.rewards")


# --------------------------------------------------------------------------------------------
# Shared machinery
# --------------------------------------------------------------------------------------------


class ScoringRewardManager(RewardManager):
    """Decode, score in worker processes, place scores, report metrics. Subclasses choose how
    samples are grouped into worker calls (:meth:`plan`) and may shape rewards
    (:meth:`shape`)."""

    name = "naive"
    accepts_batch_functions = False
    early_pool_of_its_own = False
    """Score early in a second pool, so the batch's call scores its remaining samples at the
    same time (managers whose pool scores several samples at once); otherwise early runs
    and the batch's call take turns in the one pool, as one worker scores one at a time."""

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self._pool: Any = None
        self._early_pool: Any = None
        self._said_calls_wait = False
        self._early: EarlyScores | None = None
        self._early_lock = threading.Lock()  # guards _early and the pools' creation
        # the scoring calls' time measured since the last batch (prefetched runs included)
        self._measured_lock = threading.Lock()
        self._measured_wall_s = 0.0
        self._measured_busy_s = 0.0

    # ------------------------------------------------------------------ start-up checks

    def check_data_sources(self, data_sources: Iterable[str]) -> None:
        """Every data source resolves to a function this manager can call, in a worker."""
        for data_source in sorted(set(map(str, data_sources))):
            self._scorer(data_source)

    def _scorer(self, data_source: str) -> Scorer:
        scorer = self.resolve(data_source)
        if not isinstance(scorer, Scorer):  # a resolver that returns plain functions
            scorer = Scorer.wrap(scorer, f"reward function for data_source {data_source!r}")
        if scorer.batch and not self.accepts_batch_functions:
            raise RecipeError(
                f"{scorer.label} takes whole batches (solution_strs); the {self.name!r} manager "
                "scores one sample per call: set reward.manager=batch",
                key="reward.manager",
            )
        scorer.check_picklable()
        return scorer

    # ------------------------------------------------------------------ scoring

    def __call__(self, batch: Batch) -> RewardOutput:
        samples = self.samples(batch)
        responses: torch.Tensor = batch["responses"]
        size = responses.shape[0]
        lengths = response_attention_mask(batch).sum(dim=-1).to(torch.long)
        data_sources = [s["data_source"] for s in samples]
        with self._early_lock:
            early = self._early
        if early is not None:
            results, prefetched = early.results_for(samples, self.score)
        else:
            results, prefetched = self.score(samples), 0
        self._handle_failures(results, data_sources)
        rewards = [r.score for r in results]
        shaped, shaping_extra, shaping_metrics = self.shape(rewards, lengths)
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        if size:
            last = (lengths - 1).clamp(min=0)  # an empty response keeps its score on token 0
            scores[torch.arange(size), last] = torch.tensor(shaped, dtype=torch.float32)
        extra = extra_columns(results)
        extra.update(shaping_extra)
        metrics = score_metrics(results, data_sources, scores.sum(dim=-1))
        metrics.update(shaping_metrics)
        metrics.update(self._scoring_metrics())
        metrics["perf/reward_prefetched"] = prefetched / size if size else 0.0
        return RewardOutput(token_level_scores=scores, extra=extra, metrics=metrics)

    def prefetch(self, batch: Batch) -> None:
        """Decode ``batch``'s responses and queue them for this manager's scoring thread, which
        scores what has been queued as one run of the worker pool at a time; returns at once.
        :meth:`__call__` takes their results by content (data source, decoded response,
        ground truth, extra_info), so the rows may come back in any order and any batch
        layout."""
        samples = self.samples(batch)
        if not samples:
            return
        with self._early_lock:
            if self._early is None:
                self._early = EarlyScores(self._score_early, self.name)
            early = self._early
        early.add(samples)

    def samples(self, batch: Batch) -> list[dict[str, Any]]:
        """The scoring arguments of each row: ``data_source``, ``solution_str`` (the decoded
        response), ``ground_truth`` and ``extra_info``."""
        batch.require(
            "responses",
            "response_mask",
            "data_source",
            "ground_truth",
            by=f"reward manager {self.name!r}",
        )
        size = batch["responses"].shape[0]
        texts = self.decode(batch["responses"], response_attention_mask(batch))
        extra_infos = list(batch.get("extra_info", [None] * size))
        return [
            {
                "data_source": str(data_source),
                "solution_str": text,
                "ground_truth": ground_truth,
                "extra_info": extra_info,
            }
            for data_source, text, ground_truth, extra_info in zip(
                batch["data_source"], texts, batch["ground_truth"], extra_infos, strict=True
            )
        ]

    def _score_early(self, samples: list[dict[str, Any]]) -> list[SampleResult]:
        if not self.early_pool_of_its_own:
            return self.score(samples)  # the pool runs one batch at a time, in turns
        # the batch's call scores its remaining samples while the early ones finish, rather
        # than queueing behind them for up to one call's latency
        with self._early_lock:
            if self._early_pool is None:
                self._early_pool = self.make_pool()
        return self.score(samples, pool=self._early_pool)

    def _scoring_metrics(self) -> dict[str, float]:
        """``perf/reward_workers`` now and ``perf/reward_busy_fraction`` of the calls measured
        since the last batch; the measurement starts over."""
        metrics: dict[str, float] = {}
        pools = [pool for pool in (self._pool, self._early_pool) if pool is not None]
        if pools:
            metrics["perf/reward_workers"] = float(sum(len(pool_members(p)) for p in pools))
        with self._measured_lock:
            wall, busy = self._measured_wall_s, self._measured_busy_s
            self._measured_wall_s = self._measured_busy_s = 0.0
        if wall > 0:
            metrics["perf/reward_busy_fraction"] = busy / wall
        return metrics

    def decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Each response's valid tokens as text (special tokens skipped)."""
        texts = []
        for ids, valid in zip(responses, mask, strict=True):
            tokens = ids[valid.bool()].tolist()
            texts.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return texts

    def score(self, samples: Sequence[dict[str, Any]], pool: Any = None) -> list[SampleResult]:
        """Score every sample in the worker pool (``pool``, or the manager's); one result per
        sample, in order."""
        if not samples:
            return []
        scorers = {ds: self._scorer(ds) for ds in {s["data_source"] for s in samples}}
        tasks, owners = self.plan(samples, scorers)
        pool = pool or self.pool()
        workers_started = getattr(pool, "started", 0)
        started = time.monotonic()
        outcomes = pool.run(tasks)
        seconds = time.monotonic() - started
        measured = [o for task in outcomes for o in task if o.ok and o.wall_s > 0]
        wall = sum(o.wall_s for o in measured)
        busy_s = sum(min(o.busy_s, o.wall_s) for o in measured)
        with self._measured_lock:
            self._measured_wall_s += wall
            self._measured_busy_s += busy_s
        if wall > 0:
            busy = busy_s / wall
            # a batch that started workers spent part of its time on their start-up
            if getattr(pool, "started", 0) == workers_started:
                self._say_if_calls_wait(seconds, busy, len(tasks))
        results = [SampleResult() for _ in samples]
        for task_outcomes, task_owners in zip(outcomes, owners, strict=True):
            for outcome, indices in zip(task_outcomes, task_owners, strict=True):
                _unpack(outcome, indices, results, self.config.failure_score())
        return results

    def plan(
        self, samples: Sequence[dict[str, Any]], scorers: dict[str, Any]
    ) -> tuple[list[list[Call]], list[list[list[int]]]]:
        """Worker tasks, and for each call the sample indices its outcome belongs to.

        Here: one task holding one call per sample, run in order by one worker.
        """
        calls = [Call(scorers[s["data_source"]], dict(s), self.config.timeout_s) for s in samples]
        return [calls], [[[i] for i in range(len(samples))]]

    def num_workers(self) -> int:
        return 1

    def pool(self) -> Any:
        """The worker pool the batch's call scores in, started on first use."""
        with self._early_lock:  # the scoring thread may ask for it at the same time
            if self._pool is None:
                self._pool = self.make_pool()
            return self._pool

    def make_pool(self) -> Any:
        """A new worker pool of this manager's kind (one more scores early)."""
        return ProcessPool(self.num_workers())

    def more_at_once(self, tasks: int) -> str | None:
        """What would score more samples at a time, when the pool cannot: here, a manager
        that spreads them over workers."""
        return (
            f"the {self.name} manager scores one sample at a time; reward.manager=parallel "
            "scores samples concurrently"
        )

    def _say_if_calls_wait(self, seconds: float, busy: float, tasks: int) -> None:
        # a second of scoring matters in a step; less is not worth a line
        if self._said_calls_wait or seconds < 1.0 or busy >= 0.5:
            return
        advice = self.more_at_once(tasks)
        if advice is None:
            return
        self._said_calls_wait = True
        logger.warning(
            "reward: scoring a batch took %.1f s, its calls waiting %.0f%% of their time (I/O, "
            "a remote service, a sleep) rather than computing; %s",
            seconds,
            100 * (1 - busy),
            advice,
        )

    def shape(
        self, scores: list[float], lengths: torch.Tensor
    ) -> tuple[list[float], dict[str, list[Any]], dict[str, float]]:
        """Turn scores into rewards (here: unchanged), with extra columns and metrics."""
        return scores, {}, {}

    def close(self) -> None:
        with self._early_lock:
            early, self._early = self._early, None
        if early is not None:
            early.close()  # before the pools: its thread may be running one
        for pool in (self._pool, self._early_pool):
            if pool is not None:
                pool.close()
        self._pool = self._early_pool = None

    # ------------------------------------------------------------------ failures

    def _handle_failures(self, results: list[SampleResult], data_sources: list[str]) -> None:
        errors = [i for i, r in enumerate(results) if r.status == "error"]
        if errors and self.config.on_error == "raise":
            first = errors[0]
            more = f" ({len(errors) - 1} more samples failed)" if len(errors) > 1 else ""
            raise ScoringError(
                f"reward function for data_source {data_sources[first]!r} failed on sample "
                f"{first}: {results[first].message}{more}; fix the function, or set "
                "reward.on_error=score_zero to score such samples 0 and count them in "
                "reward/errors"
            )
        for status, word in (("error", "failed"), ("timeout", "timed out")):
            failed = [i for i, r in enumerate(results) if r.status == status]
            if failed:
                sources = sorted({data_sources[i] for i in failed})
                logger.warning(
                    "reward: %d of %d samples %s and were scored %g (data sources %s; first: "
                    "sample %d, %s)",
                    len(failed),
                    len(results),
                    word,
                    self.config.failure_score(),
                    ", ".join(sources),
                    failed[0],
                    results[failed[0]].message,
                )


def pool_members(pool: Any) -> list[Any]:
    """The processes (or Ray actors) a pool runs now."""
    return list(getattr(pool, "workers", None) or getattr(pool, "actors", None) or [])


def _unpack(
    outcome: Outcome, indices: list[int], results: list[SampleResult], failure_score: float
) -> None:
    if outcome.ok:
        values = outcome.value if isinstance(outcome.value, list) else [outcome.value]
        for index, (score, extras) in zip(indices, values, strict=True):
            results[index] = SampleResult(score, extras)
        return
    for index in indices:
        results[index] = SampleResult(failure_score, {}, outcome.status, outcome.message)


# --------------------------------------------------------------------------------------------
# naive
# --------------------------------------------------------------------------------------------


class NaiveRewardManager(ScoringRewardManager):
    """One call per sample, in order, in one worker process; the score on the last token."""

    name = "naive"


# --------------------------------------------------------------------------------------------
# dapo
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class OverlongBufferConfig:
    """``reward.overlong_buffer``: DAPO's soft penalty for responses near the length limit."""

    enable: bool = option(
        False,
        "Penalise responses longer than max_resp_len - len.",
        verl="reward_model.overlong_buffer.enable",
    )
    len: int = option(
        0,
        "Length of the buffer zone, in tokens, at the end of max_resp_len.",
        verl="reward_model.overlong_buffer.len",
        validator=non_negative,
    )
    penalty_factor: float = option(
        1.0,
        "Penalty at max_resp_len; it grows linearly from 0 across the buffer.",
        verl="reward_model.overlong_buffer.penalty_factor",
        validator=non_negative,
    )
    log: bool = option(
        False,
        "Add overlong_reward and overlong columns and reward/overlong/* metrics.",
        verl="reward_model.overlong_buffer.log",
    )


@attrs.define(kw_only=True)
class DAPORewardConfig(RewardConfig):
    """The ``reward`` section for ``manager: dapo``."""

    overlong_buffer: OverlongBufferConfig = section(
        OverlongBufferConfig,
        "Overlong reward shaping.",
        verl="reward_model.overlong_buffer",
    )
    max_resp_len: int | None = option(
        None,
        "Response length the buffer ends at; unset: data.max_response_length.",
        verl="reward_model.reward_kwargs.max_resp_len",
        validator=positive,
    )


def overlong_penalty(
    length: int | torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> Any:
    """DAPO's soft overlong penalty (<= 0) for a response of ``length`` tokens.

    expected = max_resp_len - buffer_len; exceed = length - expected;
    penalty = min(-exceed / buffer_len * penalty_factor, 0).
    """
    expected = max_resp_len - buffer_len
    exceed = length - expected
    penalty = -exceed / buffer_len * penalty_factor
    if isinstance(penalty, torch.Tensor):
        return penalty.clamp(max=0.0)
    return min(penalty, 0.0)


class DAPORewardManager(ScoringRewardManager):
    """``naive`` plus DAPO's overlong buffer: reward = score + overlong penalty."""

    name = "dapo"

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        super().__init__(config, context)
        expect_config(config, DAPORewardConfig, "dapo")
        buffer = config.overlong_buffer
        self.max_resp_len = config.max_resp_len or self.recipe.data.max_response_length
        if buffer.enable:
            if buffer.len <= 0:
                raise RecipeError(
                    "must be > 0 when the overlong buffer is enabled (DAPO uses 4096 of 20480)",
                    key="reward.overlong_buffer.len",
                )
            if buffer.len > self.max_resp_len:
                raise RecipeError(
                    f"{buffer.len} is longer than max_resp_len {self.max_resp_len}; make it "
                    "smaller or raise reward.max_resp_len",
                    key="reward.overlong_buffer.len",
                )

    def more_at_once(self, tasks: int) -> str | None:
        return None  # the parallel manager has no overlong shaping to offer instead

    def shape(
        self, scores: list[float], lengths: torch.Tensor
    ) -> tuple[list[float], dict[str, list[Any]], dict[str, float]]:
        buffer = self.config.overlong_buffer  # type: ignore[attr-defined]
        if not buffer.enable:
            return scores, {}, {}
        penalties = overlong_penalty(
            lengths.to(torch.float64), self.max_resp_len, buffer.len, buffer.penalty_factor
        ).tolist()
        rewards = [s + p for s, p in zip(scores, penalties, strict=True)]
        if not buffer.log:
            return rewards, {}, {}
        extra = {
            "overlong_reward": penalties,
            "overlong": [p < 0 for p in penalties],
        }
        count = max(len(penalties), 1)
        metrics = {
            "reward/overlong/penalty_mean": sum(penalties) / count,
            "reward/overlong/ratio": sum(p < 0 for p in penalties) / count,
        }
        return rewards, extra, metrics


# --------------------------------------------------------------------------------------------
# batch
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class BatchRewardConfig(RewardConfig):
    """The ``reward`` section for ``manager: batch``."""

    batch_timeout_s: float = option(
        300.0,
        "Seconds one batch call may take; past it every sample of the call is a timeout.",
        validator=positive,
    )


class BatchRewardManager(ScoringRewardManager):
    """One call per scoring function for the whole batch: a batch-form function gets lists
    (``data_sources``, ``solution_strs``, ``ground_truths``, ``extra_infos``); a per-sample
    function is called for each row inside that one worker call."""

    name = "batch"
    accepts_batch_functions = True

    def more_at_once(self, tasks: int) -> str | None:
        return None  # a batch function decides itself how much it does at once

    def plan(
        self, samples: Sequence[dict[str, Any]], scorers: dict[str, Any]
    ) -> tuple[list[list[Call]], list[list[list[int]]]]:
        groups: dict[int, list[int]] = defaultdict(list)
        by_id = {}
        for index, sample in enumerate(samples):
            scorer = scorers[sample["data_source"]]
            groups[id(scorer)].append(index)
            by_id[id(scorer)] = scorer
        calls, owners = [], []
        for key, indices in groups.items():
            columns = {
                "data_sources": [samples[i]["data_source"] for i in indices],
                "solution_strs": [samples[i]["solution_str"] for i in indices],
                "ground_truths": [samples[i]["ground_truth"] for i in indices],
                "extra_infos": [samples[i]["extra_info"] for i in indices],
            }
            timeout = self.config.batch_timeout_s  # type: ignore[attr-defined]
            calls.append(Call(by_id[key], columns, timeout, kind="batch"))
            owners.append(indices)
        return [calls], [owners]


# --------------------------------------------------------------------------------------------
# parallel
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class ParallelRewardConfig(RewardConfig):
    """The ``reward`` section for ``manager: parallel``."""

    num_workers: int | None = option(
        None,
        "Scoring processes (or Ray actors), fixed. Unset: the CPU count (at most 8), growing "
        "while the scoring calls wait rather than compute (a remote check, a sandbox, a "
        "sleep) to as many as keep that many cores busy, up to reward.max_workers.",
        validator=positive,
    )
    max_workers: int = option(
        32,
        "Most scoring processes (or Ray actors) when reward.num_workers is unset and the "
        "calls wait rather than compute; each is a Python process with the scorer's imports.",
        validator=positive,
    )
    chunk_size: int | None = option(
        None,
        "Samples sent to a worker at a time; unset: enough for about 4 chunks per worker.",
        validator=positive,
    )
    backend: str = option(
        "processes",
        "'processes': local worker processes; 'ray': Ray actors (needs ray, and uses the "
        "running Ray cluster or starts a local one).",
        choices=["processes", "ray"],
    )


class ParallelRewardManager(ScoringRewardManager):
    """Per-sample scoring spread over several worker processes (or Ray actors), for
    expensive scorers. Each sample still has its own ``reward.timeout_s``."""

    name = "parallel"
    early_pool_of_its_own = True

    def num_workers(self) -> int:
        """The workers the pool starts with (and keeps, when ``reward.num_workers`` is set)."""
        configured = self.config.num_workers  # type: ignore[attr-defined]
        return configured or max(1, min(os.cpu_count() or 1, 8))

    def max_workers(self) -> int:
        """The most workers the pool grows to while the calls wait."""
        if self.config.num_workers:  # type: ignore[attr-defined]
            return self.config.num_workers  # type: ignore[attr-defined]
        return max(self.num_workers(), self.config.max_workers)  # type: ignore[attr-defined]

    def make_pool(self) -> Any:
        if self.config.backend == "ray":  # type: ignore[attr-defined]
            from plugrl_reward_managers.ray_pool import RayPool

            return RayPool(self.num_workers(), self.max_workers())
        return ProcessPool(self.num_workers(), self.max_workers())

    def more_at_once(self, tasks: int) -> str | None:
        workers = len(pool_members(self._pool))
        if tasks <= workers:
            return None  # every chunk had a worker already
        configured = self.config.num_workers  # type: ignore[attr-defined]
        if configured:
            return (
                f"reward.num_workers={configured} caps the workers scoring at once; raise it, "
                "or unset it to let the pool grow while the calls wait"
            )
        if workers >= self.max_workers():
            return f"the pool is at reward.max_workers={self.max_workers()}; raise it"
        return None  # it is still growing

    def plan(
        self, samples: Sequence[dict[str, Any]], scorers: dict[str, Any]
    ) -> tuple[list[list[Call]], list[list[list[int]]]]:
        # about 4 chunks per worker the pool runs now: enough to spread over workers it adds
        # during the batch, few enough that a round trip to a worker is paid per chunk
        size = self.config.chunk_size or max(  # type: ignore[attr-defined]
            1, math.ceil(len(samples) / (4 * self.pool().target_workers))
        )
        timeout = self.config.timeout_s
        tasks, owners = [], []
        for start in range(0, len(samples), size):
            indices = list(range(start, min(start + size, len(samples))))
            tasks.append(
                [
                    Call(scorers[samples[i]["data_source"]], dict(samples[i]), timeout)
                    for i in indices
                ]
            )
            owners.append([[i] for i in indices])
        return tasks, owners
