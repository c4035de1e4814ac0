"""The sample buffer between the rollouter and the trainer: finished samples in the order they
finished (the trainer picks among those it has fetched). With ``cluster: ray`` it is a
``ray.util.queue.Queue`` (an actor of Ray's), so samples travel as Ray objects; in one process,
a thread-safe ``queue.Queue``."""

from __future__ import annotations

import queue
from typing import Any, Protocol


class SampleBuffer(Protocol):
    def put(self, item: Any) -> None: ...

    def get(self, timeout: float) -> Any | None:
        """The oldest item, or ``None`` when none came within ``timeout`` seconds."""

    def get_all(self) -> list[Any]:
        """Every item there now, oldest first, without waiting."""

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

    def get_all(self) -> list[Any]:
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

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

    def get_all(self) -> list[Any]:
        from ray.util.queue import Empty

        # one consumer: what the queue holds now can only grow until it is fetched
        count = self._queue.qsize()
        if not count:
            return []
        try:
            return list(self._queue.get_nowait_batch(count))
        except Empty:
            return []

    def size(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        self._queue.shutdown(force=True)


def make_buffer(cluster_mode: str) -> SampleBuffer:
    return RaySampleBuffer() if cluster_mode == "ray" else LocalSampleBuffer()
