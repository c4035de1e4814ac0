"""Helpers for test folders."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def pip_install_into(target: Path, *sources: Path) -> Path:
    """``pip install`` (not editable, as users install them) the distributions at ``sources``
    into ``target``, without dependencies or the network: plugrl is already here."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            *map(str, sources),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return target


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[Any]:
    """A Ray instance of ``num_cpus`` logical CPUs for a test module. Its workers import the
    test helpers as ``tests.*`` modules: Ray puts the driver's working folder, the repository
    root, on their import path."""
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def wait_until(
    condition: Callable[[], Any], what: str, timeout: float = 300.0, every: float = 0.002
) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` was awaited if it is not
    within ``timeout`` seconds. The deadline is generous on purpose: a test waits for an
    event, never for an amount of time, so a loaded machine is slower but not failing."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        time.sleep(every)


@contextlib.contextmanager
def spawned_rank() -> Iterator[None]:
    """The body of a rank that ``torch.multiprocessing.spawn`` started, ended so that a
    passing rank exits 0: every rank waits at a barrier before the group goes, and a rank
    that got through leaves with ``os._exit(0)``. Gloo's threads can otherwise abort the
    process at interpreter exit ("terminate called without an active exception"), which
    spawn reports as a failure of a rank that did all its work. A rank that raised goes the
    normal way, so spawn shows its traceback."""
    import os

    import torch.distributed as dist

    try:
        yield
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
