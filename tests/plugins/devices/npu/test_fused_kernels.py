"""torch_npu's fused kernels in transformers' Qwen2/Qwen3 for fsdp2 on npu: the patched model
calls them and computes what the unpatched one does (the fake kernels are plain torch)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

import plugrl_npu
from plugrl_npu.fused_kernels import apply_fused_kernels, remove_fused_kernels
from tests.plugins.devices.npu import fake_ascend


@pytest.fixture
def kernels(monkeypatch):
    _, fused = fake_ascend.install_torch_npu(monkeypatch)
    yield fused
    remove_fused_kernels()


def tiny(config_class, model_class):
    torch.manual_seed(0)
    config = config_class(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return model_class(config).eval()


@pytest.mark.parametrize(
    ("config_class", "model_class"),
    [(Qwen2Config, Qwen2ForCausalLM), (Qwen3Config, Qwen3ForCausalLM)],
)
def test_patched_models_call_the_fused_kernels_and_agree(kernels, config_class, model_class):
    model = tiny(config_class, model_class)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
        lines = apply_fused_kernels()
        after = model(ids).logits
    assert lines == [
        "transformers Qwen2: RMSNorm -> npu_rms_norm, MLP -> npu_swiglu, rotary -> npu_rotary_mul",
        "transformers Qwen3: RMSNorm -> npu_rms_norm, MLP -> npu_swiglu, rotary -> npu_rotary_mul",
    ]
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert kernels.calls["npu_swiglu"] == 2  # one MLP per layer
    assert kernels.calls["npu_rotary_mul"] == 4  # q and k per layer
    assert kernels.calls["npu_rms_norm"] >= 5  # two per layer and the final norm


def test_remove_puts_transformers_back(kernels):
    original = modeling_qwen2.Qwen2RMSNorm.forward
    apply_fused_kernels()
    assert modeling_qwen2.Qwen2RMSNorm.forward is not original
    remove_fused_kernels()
    assert modeling_qwen2.Qwen2RMSNorm.forward is original


def test_prepare_backend_for_fsdp2_on_npu_applies_them_unless_turned_off(kernels):
    on = SimpleNamespace(device=SimpleNamespace(fused_kernels=True))
    assert len(plugrl_npu.prepare_backend("npu", "fsdp2", on)) == 2
    off = SimpleNamespace(device=SimpleNamespace(fused_kernels=False))
    remove_fused_kernels()
    assert plugrl_npu.prepare_backend("npu", "fsdp2", off) == [
        "torch_npu fused kernels off (device.fused_kernels: false)"
    ]
    assert plugrl_npu.prepare_backend("cpu", "fsdp2", on) is None
