from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's tokenizer and a ~4M-parameter Qwen2 model with weights spread wide
    enough that responses vary with the context (see tests/plugins/rollout/hf/conftest.py)."""
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
