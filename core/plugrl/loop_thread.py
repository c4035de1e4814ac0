"""An asyncio event loop in a daemon thread of its own, for code that serves coroutines to
callers on other threads (the engine groups, the agents' runtime)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any


class EventLoopThread:
    """A new event loop, running forever in a daemon thread named ``name`` from construction
    until :meth:`stop`.

    :meth:`submit` runs a coroutine on it from any other thread and returns a
    :class:`concurrent.futures.Future`; ``future.result()`` blocks the caller, so a call from
    the loop's own thread, which would wait on itself forever, is refused.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Schedule ``coroutine`` on the loop; its future. Raises :class:`RuntimeError` on the
        loop's own thread (``coroutine`` is closed, never run)."""
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                f"a blocking call cannot run on the {self.name!r} thread's own event loop; "
                "await the coroutine there instead"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel the tasks still pending on the loop and wait for them to end (up to
        ``timeout_s``), then stop the loop and join the thread; the loop is closed once the
        thread ended. Stopping twice is harmless.

        A task left pending when its loop closes is reported at exit ("Task was destroyed but
        it is pending"), with the traceback of whatever it was waiting on: a run that ends
        with samples in flight would print one of each per sample."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            ending = asyncio.run_coroutine_threadsafe(_end_pending_tasks(timeout_s), self.loop)
            with contextlib.suppress(Exception):
                ending.result(timeout_s + 1)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)
        if not self.thread.is_alive():
            self.loop.close()


async def _end_pending_tasks(timeout_s: float) -> None:
    """Cancel every other task of the running loop, wait for them (up to ``timeout_s``), and
    take their exceptions so that none is reported as never retrieved; then close the loop's
    async generators."""
    loop = asyncio.get_running_loop()
    tasks = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
    await loop.shutdown_asyncgens()
