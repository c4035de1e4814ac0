from __future__ import annotations

from pathlib import Path

import pytest

from plugrl.testing import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tokenizer and a ~4M-parameter Qwen2 model with weights spread wide enough that
    responses vary with the context (see tests/plugins/rollout/hf/conftest.py)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0, weight_std=0.15)
