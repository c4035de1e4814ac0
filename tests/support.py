"""Helpers for test folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
