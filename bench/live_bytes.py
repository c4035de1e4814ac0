"""The peak memory of a block of torch code on the CPU, counted exactly.

torch reports no high-water mark of CPU memory, and the process's resident set is a blurred
view of it (the allocator keeps freed pages, Python and the libraries have their own). What a
memory plan estimates is the memory tensors take, so that is what this counts, two ways:

* :class:`LiveBytes` counts tensor storages. When the block starts, every tensor reachable
  from Python (parameters, buffers, optimizer state, the batch: anything the garbage collector
  lists) has its storage counted once, or, when ``start_from`` names them, only those tensors
  (a process that holds tensors of other work, like a test session, then counts only the
  phase's own). Inside, a ``TorchDispatchMode`` sees the result of every operation and counts
  the storage of each tensor it has not seen yet (views and in-place results count nothing
  more); a storage leaves the count when it is freed, and one resized in place (FSDP2 frees
  and re-allocates gathered weights that way) is counted at its new size. It can say which
  operation made each byte live at the peak. It cannot see a temporary a kernel allocates
  inside itself (``logsumexp``'s ``exp(x - max)``).
* :class:`AllocatorPeak` reads the profiler's record of every allocation and free of the
  CPU allocator over the block: it sees those temporaries too. The peak of a phase is what
  ``LiveBytes`` counted at the start plus the allocator's rise.

Both depend on which tensors exist, not on the allocator's page cache: the same model, batch,
seed and thread count give the same numbers on every run.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _plain(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor holding ``tensor``'s memory (a DTensor's local shard), or None for
    tensors with no storage of their own (meta, fake, nested subclasses)."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        return _plain(local)
    if tensor.device.type == "meta" or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return None
    return tensor


class LiveBytes(TorchDispatchMode):
    """Counts live tensor storage bytes; ``peak`` is the most seen at once since entry,
    ``at_entry`` the count when the block began. ``peak_in_backward`` says whether the peak
    came in a backward pass, ``peak_op`` which operation reached it."""

    def __init__(
        self,
        device_type: str = "cpu",
        start_from: Iterable[torch.Tensor] | None = None,
        *,
        by_origin: bool = False,
    ) -> None:
        super().__init__()
        self.device_type = device_type
        self.start_from = start_from
        self.by_origin = by_origin
        """Keep, at the peak, the bytes live per operation that made them (slower)."""
        self.origin: dict[int, str] = {}
        self.peak_by_origin: dict[str, int] = {}
        self.live: dict[int, int] = {}
        """Storage identity -> its bytes now."""
        self._refs: dict[int, weakref.ref] = {}
        self.current = 0
        self.at_entry = 0
        self.peak = 0
        self.peak_op = ""
        self.peak_in_backward = False
        self._restore_resize: Callable[[], None] | None = None

    # -------------------------------------------------------------------- counting

    def _count(self, tensor: torch.Tensor, origin: str = "held at the start") -> None:
        plain = _plain(tensor)
        if plain is None or plain.device.type != self.device_type:
            return
        storage = plain.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        size = storage.nbytes()
        self.live[key] = size
        self.current += size
        if self.by_origin:
            self.origin[key] = origin
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._forget(key))

    def _forget(self, key: int) -> None:
        size = self.live.pop(key, None)
        self._refs.pop(key, None)
        self.origin.pop(key, None)
        if size is not None:
            self.current -= size

    def _resized(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self.live:
            self.current += storage.nbytes() - self.live[key]
            self.live[key] = storage.nbytes()
            self._note_peak("resize_")

    def _note_peak(self, op: str) -> None:
        if self.current > self.peak:
            self.peak = self.current
            self.peak_op = op
            self.peak_in_backward = torch._C._current_autograd_node() is not None
            if self.by_origin:
                totals: dict[str, int] = {}
                for key, size in self.live.items():
                    origin = self.origin.get(key, "?")
                    totals[origin] = totals.get(origin, 0) + size
                self.peak_by_origin = totals

    # -------------------------------------------------------------------- the mode

    def __enter__(self) -> LiveBytes:
        gc.collect()
        if self.start_from is not None:
            for tensor in self.start_from:
                self._count(tensor)
        else:
            for obj in gc.get_objects():
                try:
                    # type(), not isinstance: isinstance touches lazy module proxies
                    if issubclass(type(obj), torch.Tensor):
                        self._count(obj)
                except (RuntimeError, ReferenceError):  # a tensor being torn down, a proxy
                    continue
        self.at_entry = self.peak = self.current
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            result = original(storage, size)
            tracker._resized(storage)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

        def restore() -> None:
            torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]

        self._restore_resize = restore
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._restore_resize is not None:
            self._restore_resize()
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        if self.by_origin and torch._C._current_autograd_node() is not None:
            name += " (backward)"
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._count(item, name)
        self._note_peak(name)
        return out


@contextmanager
def rss_high_water() -> Iterator[dict[str, int]]:
    """The process's resident set (bytes) when the block starts and its high-water mark over
    the block (Linux: the mark is reset through ``/proc/self/clear_refs``; elsewhere it is the
    process's lifetime peak)."""
    result = {"rss_before": _status_bytes("VmRSS"), "rss_peak": 0}
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
    yield result
    result["rss_peak"] = _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class AllocatorPeak:
    """The most bytes the CPU allocator held at once over a block, above what it held when
    the block began, from the profiler's record of every allocation and free
    (``profile_memory``).

    This sees what :class:`LiveBytes` cannot: the temporaries a kernel allocates inside
    itself (``logsumexp``'s ``exp(x - max)``, the size of its input) never reach Python.
    Memory freed in the block that was allocated before it lowers the count as it should.
    ``peak_op`` is the innermost operation running when the peak was reached."""

    def __init__(self) -> None:
        self.rise = 0
        self.peak_op = ""

    def __enter__(self) -> AllocatorPeak:
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        events = self._profile.profiler.kineto_results.events()
        memory = sorted(
            (e for e in events if e.name() == "[memory]" and "CPU" in str(e.device_type())),
            key=lambda e: e.start_ns(),
        )
        held = peak = 0
        peak_ns = None
        for event in memory:
            held += event.nbytes()
            if held > peak:
                peak, peak_ns = held, event.start_ns()
        self.rise = peak
        if peak_ns is not None:
            running = [
                e
                for e in events
                if e.name() != "[memory]" and e.start_ns() <= peak_ns <= e.end_ns()
            ]
            if running:
                self.peak_op = min(running, key=lambda e: e.duration_ns()).name()
