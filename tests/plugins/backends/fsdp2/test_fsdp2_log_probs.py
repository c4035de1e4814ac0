"""When the fsdp2 backend lets the log-probs write their gradient over the model's output."""

from __future__ import annotations

import torch

from plugrl_fsdp2.backend import _overwritable


def test_a_head_product_may_be_overwritten_a_kept_result_may_not():
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    head = torch.nn.Linear(4, 5, bias=False)
    logits = head(hidden)
    assert _overwritable(logits)
    assert _overwritable(logits[0])  # a view of it: the product is still the backend's own
    assert _overwritable(logits.reshape(-1, 5))
    capped = torch.tanh(logits / 30)  # tanh's backward reads its own result
    assert not _overwritable(capped)
    assert not _overwritable(capped.reshape(-1, 5))
    assert _overwritable(capped * 30)  # a product by a number keeps nothing
