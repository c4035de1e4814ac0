from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's tokenizer and a ~4M-parameter Qwen2 model, built once.

    The weights are random with a large spread: a freshly initialised model's logits are
    nearly flat and every row emits the same token, while these give varied, context-dependent
    responses (different rows stop at different steps).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from plugrl_tools.quickstart import save_untrained_model

    folder = save_untrained_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.15, generator=generator)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
