"""What the fsdp2 backend says about its weights before sending them (``weight_metadata``),
and how it cuts them into buckets (``weight_buckets``). Two ranks: test_fsdp2_collective.py."""

import pytest
import torch

from plugrl.parts.rollout import WeightMeta
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_recipe


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


def test_a_tied_weight_is_sent_once_and_ties_again_in_the_engine(tmp_path):
    """The quickstart model ties lm_head to the embedding: one copy travels, and an hf engine
    of its own that receives it has both tied to the trainer's values."""
    import attrs

    from plugrl.cluster.engines import LocalEngineGroup
    from plugrl.cluster.groups import make_worker_group
    from plugrl.cluster.transports.buckets import LocalTransport
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.testing import part_context
    from plugrl_hf.config import HFRolloutConfig
    from plugrl_tools.quickstart import save_untrained_model

    folder = save_untrained_model(tmp_path / "tied", seed=0)
    recipe = make_recipe(folder)
    recipe = attrs.evolve(recipe, rollout=HFRolloutConfig(colocate=False))
    trainer = make_worker_group(recipe, "actor", device_name="cpu", plugins=get_plugin_manager())
    engines = LocalEngineGroup(recipe, device_name="cpu", plugins=get_plugin_manager())
    try:
        trainer.setup(1)
        names = [meta.name for meta in trainer.weight_metadata()]
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
        assert [name for name, _ in trainer.named_weights()] == names
        with torch.no_grad():  # the engine's copy drifts, so the push visibly changes it
            engines.engine.model.get_input_embeddings().weight.mul_(2)
        LocalTransport(recipe.rollout, part_context(recipe)).push(trainer, engines, version=1)
        assert engines.weight_version == 1
        model = engines.engine.model
        embedding = model.get_input_embeddings().weight
        assert model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
        expected = dict(trainer.named_weights())["model.embed_tokens.weight"]
        assert torch.equal(embedding, expected)
    finally:
        engines.close()
        trainer.close()
