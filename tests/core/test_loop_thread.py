"""plugrl.loop_thread.EventLoopThread: coroutines run on its own thread, a blocking call from
that thread is refused, and stopping ends the thread and closes the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from plugrl.loop_thread import EventLoopThread


def test_a_submitted_coroutine_runs_on_the_loop_thread():
    loop_thread = EventLoopThread("test-loop")
    try:

        async def where() -> str:
            await asyncio.sleep(0)
            return threading.current_thread().name

        assert loop_thread.submit(where()).result(timeout=30) == "test-loop"
        assert loop_thread.thread.daemon
    finally:
        loop_thread.stop()


def test_a_blocking_call_from_the_loop_thread_is_refused():
    loop_thread = EventLoopThread("test-loop")
    try:

        async def inner() -> int:
            return 1

        async def submit_from_inside() -> bool:
            coroutine = inner()
            with pytest.raises(RuntimeError, match="'test-loop' thread's own event loop"):
                loop_thread.submit(coroutine)
            return coroutine.cr_frame is None  # closed, never run

        assert loop_thread.submit(submit_from_inside()).result(timeout=30) is True
    finally:
        loop_thread.stop()


def test_stop_ends_the_thread_closes_the_loop_and_may_be_called_again():
    loop_thread = EventLoopThread("test-loop")
    loop_thread.stop()
    assert not loop_thread.thread.is_alive()
    assert loop_thread.loop.is_closed()
    loop_thread.stop()


def test_stopping_ends_the_pending_tasks_without_a_word_at_exit():
    """Tasks still pending when the loop stops (samples in flight when a run ends) are
    cancelled and awaited: nothing is printed at exit (a resumed fully_async agent run printed
    a "Task was destroyed but it is pending" warning and a traceback per sample)."""
    import subprocess
    import sys

    code = """
import asyncio, gc
from plugrl.loop_thread import EventLoopThread

async def waits_forever(event):
    try:
        await event.wait()
    finally:
        await asyncio.sleep(0)  # a task that still awaits as it is cancelled

thread = EventLoopThread("test-loop")
async def start():
    event = asyncio.Event()
    for _ in range(20):
        asyncio.ensure_future(waits_forever(event))
thread.submit(start()).result()
import time; time.sleep(0.1)
thread.stop()
assert thread.loop.is_closed()
del thread
gc.collect()
print("stopped")
"""
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stopped"
    assert "Task was destroyed" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
