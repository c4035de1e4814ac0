"""An asyncio event loop in a daemon thread of its own, for code that serves coroutines to
callers on other threads (the engine groups, the agents' runtime)."""

from __future__ import annotations

import asyncio
import concurrent.futures
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
        """Stop the loop and join the thread (up to ``timeout_s``); the loop is closed once
        the thread ended. Stopping twice is harmless."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)
        if not self.thread.is_alive():
            self.loop.close()
