"""vllm's memory terms: the gpu_memory_utilization reservation."""

from __future__ import annotations

from plugrl.plan import GIB
from tests.planning import P7B, plan_7b, terms


def test_reservation_holds_weights_graphs_and_cache():
    plan = plan_7b("rollout.engine=vllm", "rollout.gpu_memory_utilization=0.5")
    rollout = terms(plan, "rollout", "generate")
    assert rollout["engine weights"] == P7B * 2  # bfloat16, TP 1
    assert rollout["CUDA graphs"] == GIB
    reserved = int(0.5 * 80 * GIB)
    assert sum(rollout.values()) == reserved  # the cache is the rest of the reservation
    # colocated on Ray: asleep while the trainer runs
    assert terms(plan, "rollout", "update") == {}


def test_tensor_parallel_and_eager():
    plan = plan_7b(
        "rollout.engine=vllm", "rollout.tensor_model_parallel_size=2", "rollout.enforce_eager=true"
    )
    rollout = terms(plan, "rollout", "generate")
    assert rollout["engine weights"] == P7B * 2 // 2
    assert "CUDA graphs" not in rollout
