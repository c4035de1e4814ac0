from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plugrl.testing import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(plugrl_build_once: Callable[..., Any]) -> Path:
    """A tiny tokenizer and a ~4M-parameter Qwen2 model, built once.

    The weights are drawn with a large spread: a freshly initialised model's logits are nearly
    flat and every row emits the same token, while these give varied, context-dependent
    responses (different rows stop at different steps).
    """
    return plugrl_build_once(save_tiny_model, seed=0, weight_std=0.15)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
