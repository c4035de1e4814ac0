"""The sample buffer between the rollouter and the trainer: finished samples, first come first
served. With ``cluster: ray`` it is a ``ray.util.queue.Queue`` (an actor of Ray's), so samples
travel as Ray objects; in one process, a thread-safe ``queue.Queue``."""

from __future__ import annotations

import queue
from typing import Any, Protocol


class SampleBuffer(Protocol):
    def put(self, item: Any) -> None: ...

    def get(self, timeout: float) -> Any | None:
        """The oldest item, or ``None`` when none came within ``timeout`` seconds."""

    def size(self) -> int: ...

    def close(self) -> None: ...


class LocalSampleBuffer:
    """Threads of one process."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def get(self, timeout: float) -> Any | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def size(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        pass


class RaySampleBuffer:
    """A ``ray.util.queue.Queue``; its actor takes no CPU of the placement."""

    def __init__(self) -> None:
        from ray.util.queue import Queue

        self._queue = Queue(actor_options={"num_cpus": 0})

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def get(self, timeout: float) -> Any | None:
        from ray.util.queue import Empty

        try:
            return self._queue.get(block=True, timeout=timeout)
        except Empty:
            return None

    def size(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        self._queue.shutdown(force=True)


def make_buffer(cluster_mode: str) -> SampleBuffer:
    return RaySampleBuffer() if cluster_mode == "ray" else LocalSampleBuffer()
