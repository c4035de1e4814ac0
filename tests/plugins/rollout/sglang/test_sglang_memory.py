"""sglang's memory terms: without a device's memory, the KV cache of the batch's tokens
(the vLLM suite's environment has no sglang plugin, so these live apart from vllm's)."""

from __future__ import annotations

from tests.planning import plan_7b, terms


def test_without_device_memory_the_batch_needs_its_cache():
    plan = plan_7b("rollout.engine=sglang", device_memory=None)
    rollout = terms(plan, "rollout", "generate")
    rows = 64 * 8 // 8  # one engine per device
    assert rollout["KV cache"] == 2 * 28 * 512 * 2 * rows * (512 + 1536)
