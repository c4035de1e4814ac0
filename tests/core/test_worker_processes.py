"""plugrl.worker_processes: the framing agrees with multiprocessing's Connection both ways,
a worker's loop greets, answers and ends on an empty message or EOF, a killed group takes
the worker's children, and a worker dies with its parent."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

import pytest

from plugrl.worker_processes import (
    encode_message,
    kill_and_reap,
    receive_message,
    receive_message_async,
    send_message,
    spawn_worker_process,
    worker_code,
)

SIZES = [0, 1, 255, 70_000, 3 * (1 << 20) + 7]  # empty, small, several 1 MiB reads

ECHO_WORKER = textwrap.dedent(
    """
    import os
    import subprocess
    import sys
    import time

    from plugrl.worker_processes import serve_worker


    def handle(message, connection):
        if message == b"pid":
            connection.send_bytes(str(os.getpid()).encode())
        elif message == b"child":
            child = subprocess.Popen(["sleep", "1000"])
            connection.send_bytes(str(child.pid).encode())
        elif message == b"hang":
            time.sleep(1000)
        else:
            connection.send_bytes(message[::-1])
            connection.send_bytes(b"second answer")


    serve_worker(int(sys.argv[1]), handle, greeting=b"ready")
    """
)


def in_thread(write: Callable[[], None]) -> threading.Thread:
    """Writes that fill the socket's buffer wait for the reader: run them beside it."""
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_until_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


# ------------------------------------------------------------------------------ framing


@pytest.mark.parametrize("size", SIZES)
def test_a_connection_reads_what_send_message_sends(pair, size):
    left, right = pair
    payload = os.urandom(size)
    writing = in_thread(lambda: send_message(left, payload))
    assert Connection(os.dup(right.fileno())).recv_bytes() == payload
    writing.join(30)


@pytest.mark.parametrize("size", SIZES)
def test_receive_message_reads_what_a_connection_sends(pair, size):
    left, right = pair
    payload = os.urandom(size)
    writer = Connection(os.dup(left.fileno()))
    writing = in_thread(lambda: (writer.send_bytes(payload), writer.send_bytes(b"next")))
    assert receive_message(right) == payload
    assert receive_message(right) == b"next"  # one message read, not more
    writing.join(30)
    writer.close()


def test_the_long_header_announces_its_length_in_eight_bytes(pair):
    # a payload of 2 GiB is too large for a test; its header is built by hand
    left, right = pair
    left.sendall(struct.pack("!i", -1) + struct.pack("!Q", 5) + b"hello")
    assert receive_message(right) == b"hello"
    assert encode_message(b"hello") == struct.pack("!i", 5) + b"hello"


def test_receive_message_async_reads_messages_and_raises_eof_when_closed(pair):
    left, right = pair
    right.setblocking(False)

    async def read_two() -> list[bytes]:
        return [await receive_message_async(right), await receive_message_async(right)]

    big = os.urandom(2 * (1 << 20) + 3)

    def write() -> None:
        send_message(left, big)
        send_message(left, b"")

    async def both() -> list[bytes]:
        reading = asyncio.ensure_future(read_two())
        await asyncio.get_running_loop().run_in_executor(None, write)
        return await reading

    assert asyncio.run(both()) == [big, b""]
    left.sendall(struct.pack("!i", 10) + b"cut")  # the writer goes before the end
    left.close()
    with pytest.raises(EOFError):
        asyncio.run(receive_message_async(right))


def test_a_message_cut_short_raises_eof(pair):
    left, right = pair
    left.sendall(struct.pack("!i", 10) + b"abc")
    left.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        receive_message(right)


def test_a_negative_length_is_refused(pair):
    left, right = pair
    left.sendall(struct.pack("!i", -7))
    with pytest.raises(ValueError, match="negative length"):
        receive_message(right)


# ------------------------------------------------------------------------------ workers


def test_worker_code_imports_the_entry_without_the_working_folder():
    code = worker_code("plugrl.agents.processes:worker_main")
    assert code.splitlines() == [
        "import sys",
        "if sys.path and sys.path[0] == '':",
        "    del sys.path[0]",
        "from plugrl.agents.processes import worker_main",
        "worker_main(int(sys.argv[1]))",
    ]


@pytest.mark.parametrize("entry", ["module", "module:", ":function", "module:two words"])
def test_worker_code_refuses_what_is_not_module_colon_function(entry):
    with pytest.raises(ValueError, match="'module:function'"):
        worker_code(entry)


def test_a_worker_greets_answers_and_ends_on_an_empty_message():
    process, sock = spawn_worker_process(ECHO_WORKER)
    try:
        assert receive_message(sock) == b"ready"
        send_message(sock, b"abc")
        assert receive_message(sock) == b"cba"
        assert receive_message(sock) == b"second answer"  # a handler may answer several times
        send_message(sock, b"pid")
        assert int(receive_message(sock)) == process.pid
        assert os.getpgid(process.pid) == process.pid  # it leads a group of its own
        send_message(sock, b"")
        assert process.wait(30) == 0
    finally:
        sock.close()
        kill_and_reap(process)


def test_a_worker_ends_when_its_parent_closes_the_connection():
    process, sock = spawn_worker_process(ECHO_WORKER)
    try:
        assert receive_message(sock) == b"ready"
    finally:
        sock.close()
    try:
        assert process.wait(30) == 0
    finally:
        kill_and_reap(process)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_group_takes_the_workers_children():
    process, sock = spawn_worker_process(ECHO_WORKER)
    try:
        assert receive_message(sock) == b"ready"
        send_message(sock, b"child")
        child = int(receive_message(sock))
        assert alive(child)
        send_message(sock, b"hang")  # busy: it would not read an empty message
        assert kill_and_reap(process)
        assert process.returncode == -9
        assert wait_until_gone(child)
    finally:
        sock.close()
    kill_and_reap(process)  # a group already gone is no error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal, /proc")
def test_a_worker_dies_with_its_parent(tmp_path):
    """The worker is busy (it reads no EOF), so only the parent-death signal can end it."""
    parent = textwrap.dedent(
        f"""
        from plugrl.worker_processes import receive_message, send_message, spawn_worker_process

        process, sock = spawn_worker_process({ECHO_WORKER!r})
        assert receive_message(sock) == b"ready"
        send_message(sock, b"hang")
        print(process.pid, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True
    )
    worker = int(done.stdout.split()[-1])
    try:
        assert wait_until_gone(worker)
    finally:
        if alive(worker):
            os.kill(worker, 9)
