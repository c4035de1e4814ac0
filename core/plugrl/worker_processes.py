"""Worker processes that a deadline can kill: the parts the reward workers
(:mod:`plugrl.rewards.workers`) and the agents' tool processes (:mod:`plugrl.agents.processes`)
share, for any plugin that runs code it must be able to stop.

A Python thread cannot be stopped, so code that may hang runs in a process that can be. A
worker here is

* a **fresh interpreter** (``python -c``, :func:`spawn_worker_process`), not a fork: it inherits
  none of the parent's threads, locks or GPU state, and never re-imports the parent's
  ``__main__``; its working folder is dropped from its import path before anything is imported
  (:func:`worker_code`), so a folder named like a package there shadows nothing;
* the **leader of a process group** of its own, so :func:`kill_process_group` ends the worker
  and everything it started (a sandbox, a ``subprocess.run``) in one signal;
* **killed by the kernel when its parent dies** (:func:`die_with_parent`, Linux), so none
  outlives the run;
* connected to its parent by a **socket pair** carrying length-prefixed messages, the framing
  of :class:`multiprocessing.connection.Connection` (:func:`encode_message`,
  :func:`send_message`, :func:`receive_message`, :func:`receive_message_async`): either end may
  use a ``Connection`` or these functions;
* running a **loop** (:func:`serve_worker`) that reads messages until the parent sends an empty
  one or closes its end.

The parent end of a worker, put together::

    process, sock = spawn_worker_process(worker_code("my_plugin.worker:main"))
    send_message(sock, pickle.dumps(task))
    reply = pickle.loads(receive_message(sock))
    ...
    kill_and_reap(process)  # on a timeout, or at the end

and the worker's ``main``::

    def main(fd: int) -> None:
        serve_worker(fd, handle)  # handle(message, connection) answers with connection.send_bytes
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

REAP_TIMEOUT_S = 10.0
"""After SIGKILL, how long to wait for a process to be reaped."""

_SHORT_HEADER = struct.Struct("!i")
_LONG_HEADER = struct.Struct("!Q")
_LONG = -1
"""A short header of -1 announces a message of 2 GiB or more, whose length follows in 8 bytes."""
_SHORT_MAX = 0x7FFFFFFF


# --------------------------------------------------------------------------------------------
# Starting and stopping
# --------------------------------------------------------------------------------------------


def worker_code(entry: str) -> str:
    """The ``python -c`` program of a worker that calls ``entry`` (``"module:function"``) with
    its socket's file descriptor, the integer :func:`spawn_worker_process` passes.

    ``python -c`` puts the working folder first on the import path, where a folder named like
    the worker's package (a checkout, a run's output) would shadow the installed one; the
    program drops it before importing ``module``. (``-P`` would too, but only from Python 3.11,
    and ``-I`` drops ``PYTHONPATH`` as well.)
    """
    module, colon, function = entry.partition(":")
    if not (module and colon and function.isidentifier()):
        raise ValueError(f"worker_code takes a 'module:function' entry, got {entry!r}")
    return (
        "import sys\n"
        "if sys.path and sys.path[0] == '':\n"
        "    del sys.path[0]\n"
        f"from {module} import {function}\n"
        f"{function}(int(sys.argv[1]))\n"
    )


def spawn_worker_process(code: str) -> tuple[subprocess.Popen, socket.socket]:
    """A fresh interpreter running ``code`` with the child end of a socket pair's file
    descriptor as ``sys.argv[1]``; returns the process and the parent end. The process leads
    a process group of its own, so killing the group kills what the worker started too (the
    worker still dies with its parent, by :func:`die_with_parent`)."""
    parent_end, child_end = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", code, str(child_end.fileno())],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
        )
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()
    return process, parent_end


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent exits; elsewhere nothing.

    Strictly, when the parent *thread* that started it exits: workers started from a thread
    that ends die with it, and whoever keeps them must find them dead and start new ones.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kill_process_group(process: subprocess.Popen) -> None:
    """SIGKILL every process of the group ``process`` leads (as a worker from
    :func:`spawn_worker_process` does), and every descendant of ``process`` (Linux), those
    that left the group (``setsid``) too. The group outlives its leader while a child of it
    runs, so this also ends what an exited worker left behind. A group already gone is no
    error. A process that left the group and whose parent already died is no longer a
    descendant: nothing here finds it."""
    found = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """The processes descended from ``pid`` now, children first, read from ``/proc`` (Linux;
    empty elsewhere)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{entry.name}/stat", encoding="utf-8") as f,
            ):
                # the parent is the second field after the command, which may hold spaces
                parent = int(f.read().rpartition(")")[2].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_and_reap(process: subprocess.Popen, timeout_s: float = REAP_TIMEOUT_S) -> bool:
    """:func:`kill_process_group`, then wait up to ``timeout_s`` for the leader to be reaped
    (so no zombie is left); whether it was."""
    kill_process_group(process)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


def encode_message(payload: bytes) -> bytes:
    """``payload`` framed as :class:`multiprocessing.connection.Connection` frames it: a 4-byte
    signed big-endian length, or -1 and an 8-byte length for 2 GiB or more, then the bytes."""
    if len(payload) > _SHORT_MAX:
        return _SHORT_HEADER.pack(_LONG) + _LONG_HEADER.pack(len(payload)) + payload
    return _SHORT_HEADER.pack(len(payload)) + payload


def _length(read: Callable[[int], bytes]) -> int:
    (size,) = _SHORT_HEADER.unpack(read(_SHORT_HEADER.size))
    if size == _LONG:
        (size,) = _LONG_HEADER.unpack(read(_LONG_HEADER.size))
    elif size < 0:
        raise ValueError(f"a message header announces a negative length ({size})")
    return size


def send_message(sock: socket.socket, payload: bytes) -> None:
    """Send one message on a blocking socket."""
    sock.sendall(encode_message(payload))


def receive_message(sock: socket.socket) -> bytes:
    """Read one message from a blocking socket; :class:`EOFError` when the other end closed
    before a whole message came."""

    def read(size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the other end closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    return read(_length(read))


async def _read_exactly(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    chunks, left = [], size
    while left:
        chunk = await loop.sock_recv(sock, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


async def receive_message_async(sock: socket.socket) -> bytes:
    """Read one message from a non-blocking socket (``sock.setblocking(False)``) on the
    running event loop, leaving the loop free while it waits; :class:`EOFError` when the other
    end closed before a whole message came. Wrap it in ``asyncio.wait_for`` for a deadline."""
    (size,) = _SHORT_HEADER.unpack(await _read_exactly(sock, _SHORT_HEADER.size))
    if size == _LONG:
        (size,) = _LONG_HEADER.unpack(await _read_exactly(sock, _LONG_HEADER.size))
    elif size < 0:
        raise ValueError(f"a message header announces a negative length ({size})")
    return await _read_exactly(sock, size)


# --------------------------------------------------------------------------------------------
# The worker's loop
# --------------------------------------------------------------------------------------------


def serve_worker(
    fd: int,
    handle: Callable[[bytes, Connection], None],
    *,
    greeting: bytes | None = None,
) -> None:
    """A worker's loop on the socket ``fd`` (its ``sys.argv[1]``): die with the parent, leave
    Ctrl-C to the parent, send ``greeting`` if given (so the parent knows the worker
    started), then call ``handle(message, connection)`` for each message, which answers on
    ``connection`` (``send_bytes``, or ``send`` for a pickled object) as often as it likes.

    An empty message or the parent closing its end ends the loop, as does an ``EOFError`` or
    ``OSError`` out of ``handle`` (the parent went away while it answered). Anything else
    ``handle`` raises ends the worker with a traceback: catch what a message's work may raise
    and answer with it.
    """
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    connection = Connection(fd)
    try:
        if greeting is not None:
            connection.send_bytes(greeting)
        while True:
            message = connection.recv_bytes()
            if not message:
                return
            handle(message, connection)
    except (EOFError, OSError):
        return
