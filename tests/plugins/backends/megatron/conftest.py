import os
from pathlib import Path

import pytest
from support import (
    importable_here,
    one_torch_thread,  # noqa: F401 (autouse: one torch thread here)
)

importable_here(Path(__file__).parent)
# the fsdp2 backend's test helpers (tiny model, batches, objective) are the reference here
importable_here(Path(__file__).parents[1] / "fsdp2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from fsdp2_testing import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))
