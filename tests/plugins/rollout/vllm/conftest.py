from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from support import one_torch_thread  # noqa: F401 (autouse: one torch thread here)

PLUGIN_ROOT = Path(__file__).resolve().parents[4] / "plugins" / "rollout" / "vllm"

# plugrl-vllm is a distribution of its own: where it is not installed (the main test
# environment), its modules are imported from its source folder
if importlib.util.find_spec("plugrl_vllm") is None:
    sys.path.insert(0, str(PLUGIN_ROOT / "src"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's tokenizer and a ~4M-parameter Qwen2 model with weights spread wide
    enough that responses vary with the context (see tests/plugins/rollout/hf/conftest.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    from plugrl.quickstart import save_untrained_model

    folder = save_untrained_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.15, generator=generator)
    model.save_pretrained(folder)
    return folder
