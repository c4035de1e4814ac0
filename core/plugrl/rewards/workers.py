"""Running scoring functions in worker processes, each call under a deadline.

A Python thread cannot be stopped, so a scorer that hangs (a pathological LaTeX expression, a
network call without a timeout, an endless loop) is run in a process that can be. The pool
keeps ``num_workers`` processes alive between batches. The driver sends each worker a *task*
(a list of calls, run in order) and the worker reports every call's result as it finishes;
each report starts the clock of the next call. When a call's deadline passes, its worker is
killed (SIGKILL) and reaped, the call is a timeout, and the task's remaining calls go to a
fresh worker, so a hung sample costs its own timeout and nothing else.

A pool may grow (``max_workers`` above ``num_workers``): a scorer that waits (a remote check,
a sandbox, a sleep) leaves the cores idle, so while the calls measured spend most of their time
neither computing nor waiting for a core, the pool starts more workers, up to as many as keep
``num_workers`` cores busy (:class:`PoolSizing`). A call's time on or waiting for a core is
measured in the worker; as long as the cores are taken (by the scorers, or by anything else on
the machine) the calls wait for them and the pool does not grow.

Workers are :mod:`plugrl.worker_processes` workers: fresh interpreters (``python -c``), not
forks: they inherit none of the driver's threads, locks or GPU state, and unlike
multiprocessing's spawn they never re-import the driver's ``__main__`` (a training script
without an ``if __name__ == "__main__"`` guard works). They get the driver's ``sys.path``, so
functions the driver can import, they can too, and their working folder is not on it before
then (a folder named ``plugrl`` there does not shadow plugrl). They ask the kernel to kill
them when the driver dies, and exit on EOF when the pool closes, so none outlive the run; a
killed worker is always waited for, so none is left a zombie.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import attrs

from plugrl.errors import PluginError
from plugrl.parts.scoring import IMPORT_TIMEOUT_S
from plugrl.worker_processes import (
    REAP_TIMEOUT_S,
    kill_and_reap,
    kill_process_group,
    serve_worker,
    spawn_worker_process,
    worker_code,
)

logger = logging.getLogger("plugrl.rewards")

# A worker may take this long to import the scoring functions of a task (a first import of
# SymPy, a custom file) before its calls start being timed: as long as the driver allows.
LOAD_TIMEOUT_S = IMPORT_TIMEOUT_S


@attrs.frozen
class Call:
    """One call of a scorer, run in a worker under ``timeout_s``.

    ``scorer`` is a :class:`~plugrl.parts.scoring.Scorer` (``RewardManager.resolve``
    returns one). ``kind`` is ``"sample"``, where ``arguments`` are the keyword arguments of
    :meth:`~plugrl.parts.scoring.Scorer.score_sample` (``data_source``, ``solution_str``,
    ``ground_truth``, ``extra_info``), or ``"batch"``, where they are those of
    :meth:`~plugrl.parts.scoring.Scorer.score_batch` (the same names in the plural, one
    list each)."""

    scorer: Any
    arguments: dict[str, Any]
    timeout_s: float
    kind: str = "sample"


@attrs.frozen
class Outcome:
    """How a call ended: ``ok`` (``value`` is ``(score, extras)``, or a list of those for a
    batch call), ``error`` (``message`` says why) or ``timeout``. ``wall_s`` is the call's
    time in the worker, ``busy_s`` the part of it spent computing (in the worker and the
    processes it waited for) or waiting for a core; both 0 for a timeout or an error, and
    ``busy_s`` = ``wall_s`` when the call was too quick to measure (:data:`QUICK_CALL_S`)."""

    status: str
    value: Any = None
    message: str = ""
    wall_s: float = 0.0
    busy_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _BusyClock:
    """Seconds this process spent computing or waiting for a core, since an arbitrary start.

    CPU time counts this process and the children it waited for (a scorer that runs a
    sandbox with ``subprocess.run`` computes in the child). Waiting for a core is the
    scheduler's run-queue time from ``/proc/self/schedstat`` (Linux); without it, only CPU
    time counts, and a machine whose cores are all taken looks like a scorer that waits.
    A reading costs about 5 us."""

    def __init__(self) -> None:
        try:
            self._schedstat: int | None = os.open("/proc/self/schedstat", os.O_RDONLY)
        except OSError:
            self._schedstat = None

    def _queued_s(self) -> float:
        if self._schedstat is None:
            return 0.0
        try:
            # kept open and read with pread: about 2 us, against 30 us for open and read
            return int(os.pread(self._schedstat, 64, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def read(self) -> float:
        # process_time to the nanosecond; children only in clock ticks (10 ms), which is
        # enough for the subprocesses worth counting
        children = os.times()
        cpu = time.process_time() + children.children_user + children.children_system
        return cpu + self._queued_s()


_BUSY_CLOCK: _BusyClock | None = None


def _busy_clock() -> _BusyClock:
    global _BUSY_CLOCK
    if _BUSY_CLOCK is None:
        _BUSY_CLOCK = _BusyClock()
    return _BUSY_CLOCK


QUICK_CALL_S = 0.001
"""A call shorter than this is counted as computing, and the call after it is not measured
(``busy_s`` = ``wall_s``): two readings of the busy clock would cost as much as the call, and
no pool grows for calls this quick. A longer call's end reading times the next call."""


@attrs.define
class PoolSizing:
    """How many workers a pool runs: ``base``, or, when ``maximum`` is larger and the calls
    measured spend most of their time neither computing nor waiting for a core (they wait
    on I/O, a remote service, a sleep), as many as keep ``base`` cores busy:
    ``round(base / busy_fraction)``, at most ``maximum``.

    Each batch halves the weight of the calls measured before it, so the size follows a
    scorer whose latency changes (a remote service under load).
    """

    base: int
    maximum: int
    wall_s: float = 0.0
    busy_s: float = 0.0

    def record(self, outcome: Outcome) -> None:
        """Count a finished call (timeouts and errors are not measured)."""
        if outcome.ok and outcome.wall_s > 0:
            self.wall_s += outcome.wall_s
            self.busy_s += min(outcome.busy_s, outcome.wall_s)

    def next_batch(self) -> None:
        self.wall_s /= 2
        self.busy_s /= 2

    @property
    def busy_fraction(self) -> float | None:
        """The share of the measured calls' time spent computing or waiting for a core;
        ``None`` before any call was measured."""
        return self.busy_s / self.wall_s if self.wall_s > 0 else None

    def target(self) -> int:
        fraction = self.busy_fraction
        if self.maximum <= self.base or fraction is None:
            return self.base
        wanted = round(self.base / max(fraction, self.base / self.maximum))
        return min(self.maximum, max(self.base, wanted))


# --------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------


def run_call(call: Call) -> Outcome:
    """Run one call in this process, turning any failure into an ``error`` outcome; an ``ok``
    outcome carries the call's times."""
    return _run_timed(call, time.perf_counter(), _busy_clock().read())[0]


def _run_timed(
    call: Call, wall_start: float, busy_start: float | None
) -> tuple[Outcome, float, float | None]:
    """:func:`run_call` timed from the readings ``wall_start`` and ``busy_start`` (``None``:
    not measured, after a quick call, see :data:`QUICK_CALL_S`); also returns the readings
    the next call is timed from."""
    try:
        if call.kind == "batch":
            value: Any = call.scorer.score_batch(**call.arguments)
        else:
            value = call.scorer.score_sample(**call.arguments)
    except (Exception, SystemExit) as exc:
        return Outcome("error", message=_describe(exc)), time.perf_counter(), None
    wall_end = time.perf_counter()
    wall = wall_end - wall_start
    if wall < QUICK_CALL_S:
        return Outcome("ok", value, wall_s=wall, busy_s=wall), wall_end, None
    busy_end = _busy_clock().read()
    busy = wall if busy_start is None else busy_end - busy_start
    return Outcome("ok", value, wall_s=wall, busy_s=busy), wall_end, busy_end


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def worker_main(fd: int) -> None:
    """The worker's loop on the socket ``fd``: receive the driver's ``sys.path``, then for each
    pickled task report ``loaded`` and one ``result`` per call. An empty message or EOF ends
    it. A pool whose workers die with the thread that started them (see
    :func:`~plugrl.worker_processes.die_with_parent`) finds them dead at its next batch and
    starts new ones."""
    path_received = False

    def handle(message: bytes, connection: Connection) -> None:
        nonlocal path_received
        if not path_received:
            sys.path[:] = pickle.loads(message)
            path_received = True
            return
        _run_task(message, connection)

    serve_worker(fd, handle)


def _run_task(message: bytes, connection: Connection) -> None:
    try:
        calls: list[Call] = pickle.loads(message)
        for scorer in {id(call.scorer): call.scorer for call in calls}.values():
            scorer.prepare()
    except (Exception, SystemExit) as exc:
        connection.send(("load_error", _describe(exc)))
        return
    connection.send(("loaded",))
    # each call is timed from the end of the one before: sending that one's result is
    # counted in it, which is microseconds
    wall_mark, busy_mark = time.perf_counter(), _busy_clock().read()
    for position, call in enumerate(calls):
        outcome, wall_mark, busy_mark = _run_timed(call, wall_mark, busy_mark)
        try:
            connection.send(("result", position, outcome))
        except (EOFError, OSError):
            raise  # the driver is gone: the loop ends
        except Exception as exc:  # a result that does not pickle
            message_text = f"its result cannot be sent back: {_describe(exc)}"
            connection.send(("result", position, Outcome("error", message=message_text)))


# --------------------------------------------------------------------------------------------
# The driver side
# --------------------------------------------------------------------------------------------


# the driver's sys.path, the worker's first message, replaces the whole path
_WORKER_CODE = worker_code("plugrl.rewards.workers:worker_main")


@attrs.define(eq=False)
class _Worker:
    process: subprocess.Popen
    connection: Connection
    task: int = -1
    first: int = 0  # position in the task of the first call sent
    done: int = 0  # calls of this assignment reported so far
    count: int = 0  # calls in this assignment
    loaded: bool = False
    deadline: float = 0.0

    @property
    def busy(self) -> bool:
        return self.task >= 0


def check_pool_size(num_workers: int, max_workers: int | None) -> PoolSizing:
    """The sizing of a pool of ``num_workers`` that may grow to ``max_workers``."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if max_workers is not None and max_workers < num_workers:
        raise ValueError(f"max_workers must be >= num_workers {num_workers}, got {max_workers}")
    return PoolSizing(num_workers, max_workers or num_workers)


class ProcessPool:
    """Worker processes that run scoring calls with per-call deadlines; ``num_workers`` of
    them, growing up to ``max_workers`` while the calls wait rather than compute (see module
    doc).

    A reward manager keeps one for its life and closes it in its ``close()``; as a context
    manager it closes itself. :meth:`map` runs calls spread over the workers, :meth:`run`
    runs tasks (lists of calls each run in order by one worker)."""

    def __init__(self, num_workers: int, max_workers: int | None = None) -> None:
        self.sizing = check_pool_size(num_workers, max_workers)
        self.num_workers = num_workers
        self.workers: list[_Worker] = []
        self.killed = 0  # workers killed for a timeout, over the pool's life
        self.started = 0  # worker processes started, over the pool's life
        self._lock = threading.Lock()
        self._announced = num_workers

    @property
    def target_workers(self) -> int:
        """The workers the pool runs now: ``num_workers``, or more for calls that wait."""
        return self.sizing.target()

    # ------------------------------------------------------------------------ worker lifecycle

    def _start_worker(self) -> _Worker:
        process, parent_end = spawn_worker_process(_WORKER_CODE)
        connection = Connection(parent_end.detach())
        connection.send_bytes(pickle.dumps(list(sys.path)))
        worker = _Worker(process, connection)
        self.workers.append(worker)
        self.started += 1
        return worker

    @staticmethod
    def _alive(worker: _Worker) -> bool:
        return worker.process.poll() is None

    def _kill(self, worker: _Worker) -> None:
        """SIGKILL the worker's process group (the worker and any process a scoring function
        started) and reap the worker: nothing is left running, no zombie behind."""
        if worker in self.workers:
            self.workers.remove(worker)
        with contextlib.suppress(OSError):
            worker.connection.close()
        if not kill_and_reap(worker.process):
            logger.warning("reward worker %s did not exit after SIGKILL", worker.process.pid)

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, the others are killed."""
        with self._lock:
            for worker in list(self.workers):
                if not worker.busy:
                    with contextlib.suppress(OSError):
                        worker.connection.send_bytes(b"")
            deadline = time.monotonic() + 2.0
            for worker in list(self.workers):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(max(0.0, deadline - time.monotonic()))
                self._kill(worker)

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """The process ids of the workers alive now (they start on first use)."""
        return [w.process.pid for w in self.workers]

    def map(self, calls: Sequence[Call]) -> list[Outcome]:
        """Run every call, each on whichever worker is free, under its own deadline; one
        :class:`Outcome` per call, in order. A call that times out costs its own deadline and
        a new worker, nothing else."""
        return [outcomes[0] for outcomes in self.run([[call] for call in calls])]

    # ------------------------------------------------------------------------ running tasks

    def run(self, tasks: Sequence[Sequence[Call]]) -> list[list[Outcome]]:
        """Run every call; returns the outcomes in the order of ``tasks`` and their calls.

        Calls of one task run in order in one worker (a replacement after a timeout). A task
        whose functions cannot be loaded in a worker raises :class:`PluginError`.
        """
        with self._lock:
            self.sizing.next_batch()
            self._shrink()
            outcomes: list[list[Outcome | None]] = [[None] * len(task) for task in tasks]
            queue: deque[tuple[int, int]] = deque(
                (index, 0) for index, task in enumerate(tasks) if task
            )
            try:
                self._run(tasks, outcomes, queue)
            except BaseException:
                for worker in [w for w in self.workers if w.busy]:
                    self._kill(worker)
                raise
            return [[o for o in task if o is not None] for task in outcomes]  # all filled

    def _shrink(self) -> None:
        """Stop idle workers beyond the target: the calls got busier than when they started."""
        target = self.sizing.target()
        extra = len(self.workers) - target
        if extra <= 0:
            return
        for worker in [w for w in self.workers if not w.busy][:extra]:
            self._kill(worker)
        self._announced = target  # growing again is news again

    def _grow(self) -> bool:
        """Whether a worker may be added, saying so once per size beyond ``num_workers``."""
        target = self.sizing.target()
        if len(self.workers) >= target:
            return False
        if len(self.workers) >= self._announced:
            self._announced = target
            fraction = self.sizing.busy_fraction or 0.0
            logger.info(
                "reward: scoring calls spend %.0f%% of their time waiting (I/O, a remote "
                "service, a sleep), not computing; %d workers score at once to keep %d cores "
                "busy (at most reward.max_workers=%d)",
                100 * (1 - fraction),
                target,
                self.num_workers,
                self.sizing.maximum,
            )
        return True

    def _run(
        self,
        tasks: Sequence[Sequence[Call]],
        outcomes: list[list[Outcome | None]],
        queue: deque[tuple[int, int]],
    ) -> None:
        while True:
            self._assign(tasks, queue)
            busy = [w for w in self.workers if w.busy]
            if not busy:
                return
            now = time.monotonic()
            timeout = max(0.0, min(w.deadline for w in busy) - now)
            # a dead worker's socket reads EOF, which wakes this wait; the cap covers a worker
            # whose socket a grandchild process still holds open
            wait([w.connection for w in busy], min(timeout, 1.0))
            for worker in busy:
                self._receive(worker, tasks, outcomes, queue)
            now = time.monotonic()
            for worker in [w for w in self.workers if w.busy and now >= w.deadline]:
                self._expire(worker, tasks, outcomes, queue)

    def _assign(self, tasks: Sequence[Sequence[Call]], queue: deque[tuple[int, int]]) -> None:
        while queue:
            idle = [w for w in self.workers if not w.busy and self._alive(w)]
            for dead in [w for w in self.workers if not w.busy and not self._alive(w)]:
                self._kill(dead)
            if idle:
                worker = idle[0]
            elif self._grow():
                worker = self._start_worker()
            else:
                return
            task, first = queue.popleft()
            calls = list(tasks[task][first:])
            try:
                payload = pickle.dumps(calls)
            except Exception as exc:
                raise PluginError(
                    f"cannot send scoring calls to a worker process: {type(exc).__name__}: "
                    f"{exc}; scoring functions must be importable module-level functions"
                ) from None
            try:
                worker.connection.send_bytes(payload)
            except OSError:  # it died while idle: replace it and try again
                self._kill(worker)
                queue.appendleft((task, first))
                continue
            worker.task, worker.first, worker.done, worker.count = task, first, 0, len(calls)
            worker.loaded = False
            worker.deadline = time.monotonic() + LOAD_TIMEOUT_S

    def _current(self, worker: _Worker) -> tuple[int, int]:
        return worker.task, worker.first + worker.done

    def _receive(
        self,
        worker: _Worker,
        tasks: Sequence[Sequence[Call]],
        outcomes: list[list[Outcome | None]],
        queue: deque[tuple[int, int]],
    ) -> None:
        while worker.busy:
            try:
                if not worker.connection.poll():
                    break
                message = worker.connection.recv()
            except (EOFError, OSError):
                self._died(worker, tasks, outcomes, queue)
                return
            kind = message[0]
            if kind == "loaded":
                worker.loaded = True
                worker.deadline = time.monotonic() + self._timeout_of(worker, tasks)
            elif kind == "load_error":
                detail = message[1]
                worker.task = -1
                raise PluginError(
                    f"a scoring worker process could not load the reward functions: {detail}"
                )
            elif kind == "result":
                task, position = self._current(worker)
                outcomes[task][position] = message[2]
                self.sizing.record(message[2])
                worker.done += 1
                if worker.done == worker.count:
                    worker.task = -1
                else:
                    worker.deadline = time.monotonic() + self._timeout_of(worker, tasks)
        if worker.busy and not self._alive(worker) and not self._has_data(worker):
            self._died(worker, tasks, outcomes, queue)

    @staticmethod
    def _has_data(worker: _Worker) -> bool:
        try:
            return worker.connection.poll()
        except (EOFError, OSError):
            return False

    def _timeout_of(self, worker: _Worker, tasks: Sequence[Sequence[Call]]) -> float:
        task, position = self._current(worker)
        return tasks[task][position].timeout_s

    def _died(
        self,
        worker: _Worker,
        tasks: Sequence[Sequence[Call]],
        outcomes: list[list[Outcome | None]],
        queue: deque[tuple[int, int]],
    ) -> None:
        try:
            code = worker.process.wait(REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        task, position = self._current(worker)
        self._kill(worker)
        reason = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        if not worker.loaded:
            raise PluginError(
                f"a scoring worker process died ({reason}) while loading the reward functions"
            )
        outcomes[task][position] = Outcome(
            "error", message=f"the scoring worker process died ({reason}) during this sample"
        )
        if position + 1 < len(tasks[task]):
            queue.appendleft((task, position + 1))

    def _expire(
        self,
        worker: _Worker,
        tasks: Sequence[Sequence[Call]],
        outcomes: list[list[Outcome | None]],
        queue: deque[tuple[int, int]],
    ) -> None:
        task, position = self._current(worker)
        loaded = worker.loaded
        self._kill(worker)
        self.killed += 1
        if not loaded:
            raise PluginError(
                f"a scoring worker process took over {LOAD_TIMEOUT_S:.0f} s to import the "
                "reward functions; check what the reward function's module does at import"
            )
        call = tasks[task][position]
        outcomes[task][position] = Outcome(
            "timeout", message=f"took over {call.timeout_s:g} s (reward.timeout_s)"
        )
        if position + 1 < len(tasks[task]):
            queue.appendleft((task, position + 1))

    def __del__(self) -> None:
        # a pool dropped without close(): its daemon workers would otherwise live until exit
        try:
            for worker in list(self.workers):
                kill_process_group(worker.process)
                worker.process.wait(REAP_TIMEOUT_S)
        except Exception:
            pass
