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
