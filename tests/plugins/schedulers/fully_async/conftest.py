from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import (
    importable_here,
    one_torch_thread,  # noqa: F401 (autouse: one torch thread here)
)

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
importable_here(Path(__file__).parents[3] / "e2e")


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory):
    from plugrl.quickstart.untrained import build_untrained_task

    return build_untrained_task(tmp_path_factory.mktemp("tiny-task"))
