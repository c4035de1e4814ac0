import os
from pathlib import Path

import pytest
from support import importable_here

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
importable_here(Path(__file__).parent)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from fsdp2_testing import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    # the models are tiny: a second thread only adds waiting when other processes share the
    # cores
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
