"""fsdp2's memory terms: sharding, LoRA, offload, Ulysses, the reference model, the critic."""

from __future__ import annotations

from tests.planning import P7B, plan_7b, terms

TOKENS = 2 * (512 + 1536)  # two full-length rows per micro-batch


def test_sharded_over_the_mesh_and_fsdp_size():
    actor = terms(plan_7b(), "actor")
    assert actor["parameters"] == -(-P7B * 4 // 8)
    assert actor["optimizer states"] == -(-2 * P7B * 4 // 8)
    hybrid = terms(plan_7b("actor.fsdp_size=4"), "actor")
    assert hybrid["parameters"] == -(-P7B * 4 // 4)


def test_without_mixed_precision_weights_stay_in_model_dtype():
    actor = terms(plan_7b("actor.mixed_precision=false"), "actor")
    assert actor["parameters"] == -(-P7B * 2 // 8)
    assert actor["optimizer states"] == -(-2 * P7B * 2 // 8)


def test_lora_trains_adapters_over_a_frozen_base():
    actor = terms(plan_7b("model.lora_rank=32"), "actor")
    h, i, a, k = 3584, 18944, 3584, 512
    per_layer = (h + a) + 2 * (h + k) + (a + h) + 2 * (h + i) + (i + h)
    adapters = 28 * 32 * per_layer
    assert actor["parameters"] == -(-adapters * 4 // 8)
    assert actor["gradients"] == -(-adapters * 4 // 8)
    assert actor["optimizer states"] == -(-2 * adapters * 4 // 8)
    assert actor["frozen base weights"] == -(-P7B * 2 // 8)


def test_offload_leaves_only_the_gathered_units():
    actor = terms(plan_7b("actor.param_offload=true"), "actor")
    for name in ("parameters", "gradients", "optimizer states"):
        assert name not in actor  # zero bytes on the device: left out of the phase
    layer = 233_057_792
    # the root (untied embeddings and head, final norm), a running and a prefetched layer
    assert actor["gathered weights"] == (2 * 152_064 * 3584 + 3584 + 2 * layer) * 2


def test_ulysses_splits_the_tokens_of_a_rank():
    plain = terms(plan_7b(), "actor")
    split = terms(plan_7b("actor.ulysses_sequence_parallel_size=2"), "actor")
    # each rank scores every position of its half of the rows, prompt included, from the
    # slice's bfloat16 head output, read where it lies
    assert split["lm_head output"] == TOKENS // 2 * 152_064 * 2
    assert plain["lm_head output"] == 2 * 1536 * 152_064 * 2
    chunk = 32 * 2**20 // 152_064  # 220 tokens
    # no entropy in the update: a float32 buffer of the chunk and a bfloat16 one
    assert split["log-prob chunk"] == plain["log-prob chunk"] == chunk * 152_064 * (4 + 2)
    assert split["activations"] * 2 == plain["activations"]


def test_reference_model_with_kl_loss():
    ref = terms(plan_7b("actor.use_kl_loss=true"), "ref", "log_prob")
    assert ref["parameters"] == -(-P7B * 2 // 8)  # frozen, model.dtype
    assert ref["lm_head output"] == 2 * 1536 * 152_064 * 2
    assert "ref" not in {t.role for t in plan_7b().phases[0].terms}


def test_critic_with_gae():
    critic = terms(plan_7b("algorithm.adv_estimator=gae"), "critic")
    assert critic["parameters"] == -(-P7B * 4 // 8)
    assert critic["value head output"] == TOKENS * 12
    assert "lm_head output" not in critic and "log-prob chunk" not in critic
