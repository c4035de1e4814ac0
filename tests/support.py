"""Helpers for test folders."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def importable_here(folder: str | Path) -> None:
    """Make a test folder's helper modules importable as top-level modules, here and in the
    worker processes (Ray actors) tests start, which inherit PYTHONPATH."""
    folder = str(Path(folder).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])


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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run a folder's tests on one intra-op torch thread, then restore the setting.

    The tiny models' operations are small: a second thread gains little, and when other
    processes keep the cores busy, threads waiting on each other make every operation many
    times slower. A folder opts in by importing this fixture into its conftest.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[Any]:
    """A Ray instance of ``num_cpus`` logical CPUs for a test module. Its workers import the
    helper modules of the test folders that called :func:`importable_here`, through the
    ``PYTHONPATH`` that set."""
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
