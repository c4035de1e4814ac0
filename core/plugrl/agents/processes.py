"""Running a function in a worker process that a deadline can kill.

An agent's tool calls share one event loop, and a Python thread cannot be stopped: a tool that
computes, blocks or hangs must run where a timeout can end it. :func:`run_in_process` runs a
``"module:function"`` in a worker interpreter and returns its result; when ``timeout_s``
passes, the worker's whole process group (the worker and every process the function started)
is SIGKILLed and reaped, and :class:`ToolTimeout` is raised.

Workers are :mod:`plugrl.worker_processes` workers, as the reward workers are: fresh
interpreters, not forks, run with the driver's ``sys.path`` as of each call, in a process group
of their own, and killed by the kernel when the driver dies. A few are kept warm between calls
(:data:`MAX_IDLE_WORKERS`), so a call costs a message, not an interpreter's start. A call with
:class:`ResourceLimits` gets a fresh worker that applies them and is thrown away after the
call: limits cannot be lifted again.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import inspect
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import attrs

from plugrl.agents.limits import ResourceLimits
from plugrl.worker_processes import (
    encode_message,
    kill_and_reap,
    receive_message_async,
    serve_worker,
    spawn_worker_process,
    worker_code,
)

MAX_IDLE_WORKERS = 4
"""Idle workers kept for the next calls; more are started when more calls run at once, and
stopped when they finish beyond this count."""

DEATH_WAIT_S = 2.0
"""How long a worker whose connection closed is given to exit, for its exit status."""

START_TIMEOUT_S = 60.0
"""How long a new worker may take to start (its interpreter and plugrl's import) before the
call's own deadline starts: a loaded machine slows starts, and a start is not the call's
fault."""


class ToolTimeout(TimeoutError):
    """A call ran past its deadline; its worker and what the worker started were killed."""


class RemoteError(RuntimeError):
    """The function raised in its worker (or the worker died). The message is the last line
    of the remote traceback (``ValueError: no such file``); ``remote_traceback`` holds it
    whole."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


# --------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------


def _resolve(path: str) -> Any:
    module_name, _, name = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "error"


def worker_main(fd: int) -> None:
    """A worker's loop on the socket ``fd``: say ``ready``, then run each pickled
    ``(function, args, limits, sys_path)`` with the driver's ``sys_path`` and send back
    ``("ok", value)`` or ``("error", last line, traceback)``. An empty message or EOF ends
    it."""
    serve_worker(fd, _run_call, greeting=b"ready")


def _run_call(message: bytes, connection: Connection) -> None:
    function = "the function"
    try:
        function, args, limits, path = pickle.loads(message)
        # the driver's path as of this call: a warm worker follows a path changed since
        sys.path[:] = path
        if limits is not None:
            limits.apply()
        value = _resolve(function)(*args)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        reply: tuple[Any, ...] = ("ok", value)
    except BaseException as exc:  # SystemExit too: the caller is told
        text = "".join(traceback.format_exception(exc))
        reply = ("error", _last_line(text), text)
    try:
        payload = pickle.dumps(reply)
    except Exception as exc:
        text = (
            f"the result of {function} cannot be pickled ({type(exc).__name__}: {exc}); "
            "return plain data (str, numbers, lists, dicts)"
        )
        payload = pickle.dumps(("error", _last_line(text), text))
    connection.send_bytes(payload)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# --------------------------------------------------------------------------------------------
# The driver side
# --------------------------------------------------------------------------------------------


_WORKER_CODE = worker_code("plugrl.agents.processes:worker_main")


@attrs.define(eq=False)
class _Worker:
    process: subprocess.Popen
    sock: socket.socket


_idle: list[_Worker] = []
_lock = threading.Lock()


def _start_worker() -> _Worker:
    # a process group of its own: a timeout kills what the function started too
    process, parent_end = spawn_worker_process(_WORKER_CODE)
    parent_end.setblocking(False)
    return _Worker(process, parent_end)


def _kill(worker: _Worker) -> None:
    """SIGKILL the worker's process group and reap the worker."""
    with contextlib.suppress(OSError):
        worker.sock.close()
    kill_and_reap(worker.process)


async def _new_worker() -> _Worker:
    worker = _start_worker()
    try:
        await asyncio.wait_for(receive_message_async(worker.sock), START_TIMEOUT_S)
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
        _kill(worker)
        raise RemoteError(
            f"a worker process did not start in {START_TIMEOUT_S:g} s; check that "
            f"{sys.executable} -c 'import plugrl' runs"
        ) from None
    except (EOFError, OSError):
        reason = await _describe_death(worker)
        _kill(worker)
        raise RemoteError(
            f"a worker process ended as it started ({reason}); check that "
            f"{sys.executable} -c 'import plugrl' runs"
        ) from None
    except BaseException:
        _kill(worker)
        raise
    return worker


def _take_idle() -> _Worker | None:
    with _lock:
        while _idle:
            worker = _idle.pop()
            if worker.process.poll() is None:
                return worker
            _kill(worker)
    return None


def _give_back(worker: _Worker) -> None:
    with _lock:
        if len(_idle) < MAX_IDLE_WORKERS and worker.process.poll() is None:
            _idle.append(worker)
            return
    _kill(worker)


def close_workers() -> None:
    """Stop the idle workers (at exit, or to start afresh)."""
    with _lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        _kill(worker)


atexit.register(close_workers)


async def _describe_death(worker: _Worker) -> str:
    """How a worker whose connection closed ended, waited for without blocking the loop."""
    deadline = time.monotonic() + DEATH_WAIT_S
    while (code := worker.process.poll()) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if code is None:
        return "it closed its connection and still ran"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


async def run_in_process(
    function: str, *args: Any, timeout_s: float, limits: ResourceLimits | None = None
) -> Any:
    """``function(*args)`` (``"module:function"``, importable in a fresh interpreter; a
    coroutine function is run to completion there) in a worker process, its result pickled
    back.

    Raises :class:`ToolTimeout` when the call takes over ``timeout_s`` (its worker's process
    group is killed), :class:`RemoteError` when the function raises (the message is the last
    line of its traceback) or its worker dies. Cancelling the awaiting task kills the worker
    too.
    """
    module_name, colon, name = function.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(
            f"run_in_process takes a 'module:function' path, got {function!r}; "
            "write it as 'package.module:function'"
        )
    if timeout_s <= 0:
        raise ValueError(f"run_in_process needs a positive timeout_s, got {timeout_s}")
    try:
        payload = encode_message(pickle.dumps((function, args, limits, list(sys.path))))
    except Exception as exc:
        raise TypeError(
            f"the arguments of {function} cannot be pickled ({type(exc).__name__}: {exc}); "
            "pass plain data (str, numbers, lists, dicts)"
        ) from None
    worker = (_take_idle() if limits is None else None) or await _new_worker()
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(worker.sock, payload)
        reply = pickle.loads(await asyncio.wait_for(receive_message_async(worker.sock), timeout_s))
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
        _kill(worker)
        raise ToolTimeout(f"{function} took over {timeout_s:g} s; its process was killed") from None
    except (EOFError, OSError):
        reason = await _describe_death(worker)
        _kill(worker)
        raise RemoteError(f"the worker process running {function} died ({reason})") from None
    except BaseException:
        _kill(worker)
        raise
    if limits is None:
        _give_back(worker)
    else:
        _kill(worker)
    if reply[0] == "ok":
        return reply[1]
    raise RemoteError(reply[1], reply[2])
