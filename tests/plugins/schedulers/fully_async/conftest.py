from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory):
    from plugrl_tools.quickstart.untrained import build_untrained_task

    return build_untrained_task(tmp_path_factory.mktemp("tiny-task"))
