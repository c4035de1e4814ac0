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
