import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(plugrl_build_once):
    from tests.plugins.backends.fsdp2.fsdp2_testing import save_tiny_qwen2

    return plugrl_build_once(save_tiny_qwen2)
