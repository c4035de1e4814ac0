"""What the fsdp2 backend says about its weights before sending them (``weight_metadata``),
and how it cuts them into buckets (``weight_buckets``). Two ranks: test_fsdp2_collective.py."""

import pytest
import torch
from fsdp2_testing import make_backend, make_recipe

from plugrl.parts.rollout import WeightMeta


def described(weights) -> list[WeightMeta]:
    return [
        WeightMeta(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        for name, tensor in weights
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_metadata_of_one_rank_is_what_named_weights_yields(tiny_model, dtype):
    backend = make_backend(make_recipe(tiny_model, dtype=dtype))
    metadata = backend.weight_metadata()
    assert metadata == described(backend.named_weights())
    assert {meta.dtype for meta in metadata} == {dtype}


def test_buckets_stay_under_the_limit_and_hold_every_weight_once_in_order(tiny_model):
    backend = make_backend(make_recipe(tiny_model))
    weights = list(backend.named_weights())
    limit = 40_000  # the embedding and lm_head (65,536 bytes each) are larger
    buckets = list(backend.weight_buckets(limit))
    sizes = [sum(t.numel() * t.element_size() for _, t in bucket) for bucket in buckets]
    alone = [bucket[0][0] for bucket, size in zip(buckets, sizes, strict=True) if size > limit]
    assert alone == ["model.embed_tokens.weight", "lm_head.weight"]
    assert all(
        len(bucket) == 1 for bucket, size in zip(buckets, sizes, strict=True) if size > limit
    )
    # a bucket is closed only when the next weight would not fit
    for size, following in zip(sizes, buckets[1:], strict=False):
        head = following[0][1]
        assert size + head.numel() * head.element_size() > limit
    sent = [weight for bucket in buckets for weight in bucket]
    assert [name for name, _ in sent] == [name for name, _ in weights]
    for (name, got), (_, want) in zip(sent, weights, strict=True):
        assert torch.equal(got, want), name
    # one bucket holds everything when the limit allows
    assert len(list(backend.weight_buckets(1 << 30))) == 1
