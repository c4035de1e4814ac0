from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run these tests on one intra-op thread, then restore the setting (see
    tests/core/data/conftest.py for why)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
