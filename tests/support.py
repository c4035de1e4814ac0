"""Helpers for test folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def importable_here(folder: str | Path) -> None:
    """Make a test folder's helper modules importable as top-level modules, here and in the
    worker processes (Ray actors) tests start, which inherit PYTHONPATH."""
    folder = str(Path(folder).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])
