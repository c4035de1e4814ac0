"""The reward model's and the judge's memory terms."""

from __future__ import annotations

from tests.planning import P7B, plan_7b, terms


def test_reward_model_weights_and_scoring_forward():
    plan = plan_7b("reward.manager=reward_model", "reward.model.path=qwen2.5-0.5b")
    scoring = terms(plan, "reward_model", "generate", devices="reward_model")
    assert scoring["reward model weights"] == 494_032_768 * 2
    assert scoring["scoring forward"] > 0
    offloaded = plan_7b(
        "reward.manager=reward_model", "reward.model.path=qwen2.5-0.5b", "reward.offload=true"
    )
    assert terms(offloaded, "reward_model", "update", devices="reward_model") == {}


def test_judge_weights_and_cache():
    plan = plan_7b("reward.manager=judge", "reward.judge.model.path=qwen2.5-7b")
    judge = terms(plan, "judge", "generate", devices="judge")
    assert judge["judge weights"] == P7B * 2
    answers = 64 * 8
    assert judge["judge KV cache"] == 2 * 28 * 512 * 2 * answers * (512 + 1536 + 512)
