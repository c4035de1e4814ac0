from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from plugrl_hf import kv


def decode_inputs(rows=5, heads=4, kv_heads=2, keys=9, dim=16):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, heads, 1, dim, generator=generator)
    # keys and values as the slot buffers hand them over: a window of a wider buffer
    key = torch.randn(rows, kv_heads, keys + 4, dim, generator=generator)[:, :, 2 : 2 + keys]
    value = torch.randn(rows, kv_heads, keys + 4, dim, generator=generator)[:, :, 2 : 2 + keys]
    allowed = torch.rand(rows, keys, generator=generator) > 0.3
    allowed[:, -1] = True  # the new token
    additive = torch.zeros(()).masked_fill(~allowed, torch.finfo(torch.float32).min)
    mask = additive[:, None, None, :].expand(-1, kv_heads, 1, -1).contiguous()
    return query, key, value, allowed, mask


class Module(torch.nn.Module):
    num_key_value_groups = 2
    training = False


def test_decode_attention_equals_sdpa():
    query, key, value, allowed, mask = decode_inputs()
    output, _ = kv._decode_attention(Module(), query, key, value, mask, scaling=0.3)
    expected, _ = sdpa_attention_forward(
        Module(), query, key, value, allowed[:, None, None, :], scaling=0.3
    )
    assert output.shape == expected.shape == (5, 1, 4, 16)
    assert torch.allclose(output, expected, atol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_attention_with_other_inputs_goes_to_the_model_kernel(implementation, monkeypatch):
    query, key, value, _, mask = decode_inputs()
    bias = torch.randn(5, 4, 1, 9, generator=torch.Generator().manual_seed(1))
    token = kv._model_attention.set(implementation)
    calls = []
    original = kv._model_attention_function

    def spy(module):
        calls.append(module)
        if implementation == "eager":
            return lambda *args, **kwargs: ("eager", None)
        return original(module)

    monkeypatch.setattr(kv, "_model_attention_function", spy)
    try:
        output, _ = kv._decode_attention(
            Module(), query, key, value, mask, scaling=0.3, position_bias=bias
        )
    finally:
        kv._model_attention.reset(token)
    assert len(calls) == 1
    if implementation == "eager":
        assert output == "eager"
    else:
        expected, _ = sdpa_attention_forward(
            Module(), query, key, value, mask[:, :1], scaling=0.3, position_bias=bias
        )
        assert torch.allclose(output, expected, atol=1e-5)
        plain, _ = kv._decode_attention(Module(), query, key, value, mask, scaling=0.3)
        assert not torch.allclose(output, plain, atol=1e-3), "the bias was applied"


def test_eager_attention_of_the_modeling_file():
    from transformers.models.qwen2 import modeling_qwen2

    module = modeling_qwen2.Qwen2Attention.__new__(modeling_qwen2.Qwen2Attention)
    token = kv._model_attention.set("eager")
    try:
        assert kv._model_attention_function(module) is modeling_qwen2.eager_attention_forward
    finally:
        kv._model_attention.reset(token)


def test_a_longer_query_goes_to_the_model_kernel():
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(3, 4, 5, 16, generator=generator)
    key = torch.randn(3, 2, 5, 16, generator=generator)
    value = torch.randn(3, 2, 5, 16, generator=generator)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(3, 1, 5, 5)
    output, _ = kv._decode_attention(Module(), query, key, value, causal, scaling=0.25)
    expected, _ = sdpa_attention_forward(Module(), query, key, value, causal, scaling=0.25)
    assert torch.allclose(output, expected)
