"""Test assets built once and shared: :func:`build_once`.

A tiny model, tokenizer or data set takes seconds to build, and a test suite asks for the same
one in many modules and in each of pytest-xdist's worker processes. :func:`build_once` builds
it the first time it is asked for under a folder and hands every later caller, in any process,
what that first build returned. The ``plugrl_build_once`` fixture calls it with a folder of the
test session (shared by its xdist workers, new each session), so a change to a builder is
always built afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["build_once"]


def build_once(root: str | Path, build: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``build(folder, *args, **kwargs)`` once for each builder and arguments under ``root``;
    later calls, from this process or another one, return what the first returned.

    ``folder`` is ``root/<builder name>-<hash of the builder and its arguments>``: arguments
    must have a stable ``repr`` (numbers, strings, paths, tuples of them). The builder writes
    only under ``folder`` and returns something picklable that stays valid there (a path, a
    record of paths). Callers must not change the files: other tests read them.

    Builds of one folder are serialised by a lock file beside it, so two processes never
    write it at once; a build that raises leaves no result behind, and the next call builds
    again from an empty folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    identity = repr((build.__module__, build.__qualname__, args, sorted(kwargs.items())))
    name = f"{build.__name__}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    folder, result_file = root / name, root / f"{name}.pickle"
    with _locked(root / f"{name}.lock"):
        if result_file.exists():
            return pickle.loads(result_file.read_bytes())
        if folder.exists():  # a build that failed
            shutil.rmtree(folder)
        result = build(folder, *args, **kwargs)
        partial = result_file.with_name(f"{result_file.name}.{os.getpid()}")
        partial.write_bytes(pickle.dumps(result))
        partial.replace(result_file)
        return result


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
