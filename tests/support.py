"""Helpers for test folders."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
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
