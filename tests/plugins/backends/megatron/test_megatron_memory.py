"""megatron's memory terms: TP/PP split, the distributed optimizer, offloads, recompute."""

from __future__ import annotations

from plugrl.plan import read_shape
from plugrl_megatron.memory import stage_parameters
from tests.planning import plan_7b, terms

MEGATRON = ["actor.backend=megatron"]


def test_stage_parameters_by_hand():
    shape = read_shape("qwen2.5-7b")
    layer, table = 233_057_792, 152_064 * 3584
    # TP 2, PP 2: 14 layers and one end (embedding or head) per stage, over 2 ranks
    assert stage_parameters(shape, 2, 2) == -(-(14 * layer + table) // 2)
    # PP 1: every layer, the embedding and the untied head
    assert stage_parameters(shape, 1, 1) == 28 * layer + 2 * table


def test_distributed_optimizer_shards_over_data_parallel():
    plan = plan_7b(*MEGATRON, "actor.tensor_model_parallel_size=2")
    actor = terms(plan, "actor")
    params = stage_parameters(read_shape("qwen2.5-7b"), 2, 1)
    assert actor["parameters"] == params * 2
    assert actor["gradient buffers"] == params * 4
    # float32 main copy + two moments, over DP = 8 / 2
    assert actor["optimizer states"] == -(-params * 12 // 4)
    whole = terms(
        plan_7b(
            *MEGATRON,
            "actor.tensor_model_parallel_size=2",
            "actor.use_distributed_optimizer=false",
        ),
        "actor",
    )
    assert whole["optimizer states"] == params * 12


def test_offloads_leave_the_generate_phase():
    plan = plan_7b(*MEGATRON, "actor.param_offload=true", "actor.optimizer_offload=true")
    generate = terms(plan, "actor", "generate")
    assert "parameters" not in generate and "optimizer states" not in generate
    assert "parameters" in terms(plan, "actor", "update")


def test_full_recompute_keeps_layer_inputs():
    full = terms(plan_7b(*MEGATRON, "actor.recompute_granularity=full"), "actor")
    none = terms(plan_7b(*MEGATRON), "actor")
    assert full["activations"] < none["activations"] / 4


V7B = 152_064
CHUNK_7B = 32 * 2**20 // V7B  # the log-probs' chunk at Qwen2.5-7B's vocabulary: 220 tokens


def _instant(plan, phase: str, instant: str) -> dict:
    return {t.name: t.bytes for t in plan.phase("trainer", phase).instants[instant]}


def test_update_logit_terms_by_hand():
    # 2 rows of 512 + 1536 tokens: T = 4096 positions, R = 3072 response positions
    tokens, response = 2 * 2048, 2 * 1536
    plan = plan_7b(*MEGATRON)
    backward = _instant(plan, "update", "actor backward")
    activations = backward.pop("activations")
    # the log-probs' backward: the whole output in bfloat16, kept by the gather, the float32
    # response rows the log-probs keep and write the gradient over, and one float32 chunk
    assert backward == {
        "logits (model.dtype)": tokens * V7B * 2,
        "logits (float32)": response * V7B * 4,
        "log-prob chunk": CHUNK_7B * V7B * 4,
    }
    # the cast's backward: the float32 gradient and its bfloat16 cast
    assert _instant(plan, "update", "actor cast backward") == {
        "activations": activations,
        "logits (model.dtype)": tokens * V7B * 2,
        "logit gradient (float32)": response * V7B * 4,
        "response logit gradient": response * V7B * 2,
    }
    # the gather's backward: a fresh gradient over every position beside the output
    assert _instant(plan, "update", "actor output gradient") == {
        "activations": activations,
        "logits (model.dtype)": tokens * V7B * 2,
        "output gradient": tokens * V7B * 2,
        "response logit gradient": response * V7B * 2,
    }
    assert plan.phase("trainer", "update").worst_instant == "actor cast backward"
    # an entropy bonus needs a second float32 buffer in the chunk
    bonus = _instant(plan_7b(*MEGATRON, "actor.entropy_coeff=0.01"), "update", "actor backward")
    assert bonus["log-prob chunk"] == CHUNK_7B * V7B * 8
    # float32 logits need no cast, so there is no cast backward
    single = plan_7b(*MEGATRON, "model.dtype=float32").phase("trainer", "update")
    assert "actor cast backward" not in single.instants


def test_log_prob_logit_terms_by_hand():
    tokens, response = 2 * 2048, 2 * 1536
    plan = plan_7b(*MEGATRON)
    cast = _instant(plan, "log_prob", "actor output cast")
    assert cast == {
        "logits (model.dtype)": tokens * V7B * 2,
        "response logits (model.dtype)": response * V7B * 2,
        "logits (float32)": response * V7B * 4,
    }
    # the actor's log-prob pass computes the entropy metric: two float32 chunk buffers
    assert _instant(plan, "log_prob", "actor log-probs") == {
        "logits (model.dtype)": tokens * V7B * 2,
        "logits (float32)": response * V7B * 4,
        "log-prob chunk": CHUNK_7B * V7B * 8,
    }
    assert plan.phase("trainer", "log_prob").worst_instant == "actor output cast"
