"""Fixtures of the vision-language data tests."""

import pytest

from plugrl.data.dataset import load_tokenizer
from plugrl.data.multimodal import load_multimodal
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig


@pytest.fixture(scope="module")
def vision(tiny_vl_model):
    """(tokenizer, multimodal processing) of the tiny vision-language model."""
    model = ModelConfig(path=str(tiny_vl_model))
    tokenizer = load_tokenizer(model)
    return tokenizer, load_multimodal(model, tokenizer, get_plugin_manager())
