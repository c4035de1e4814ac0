"""``reward.placement: ray``: the reward model on Ray actors, micro-batches spread over them."""

from __future__ import annotations

import time

import pytest

from tests.plugins.rewards.reward_model.rm_testlib import PROMPTS, RESPONSES, by_hand, rm_batch
from tests.support import shared_ray_for_module

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    # one local Ray for the module: starting it is most of each test's time
    with shared_ray_for_module():
        yield


@pytest.mark.slow
def test_ray_actors_score_as_the_model_does(ray_cluster, build, rm_folder, policy_tokenizer):
    manager = build(
        model={"path": str(rm_folder)}, placement="ray", num_workers=2, micro_batch_size=1
    )
    assert len(manager._actors) == 2
    assert manager._runner is None
    output = manager(rm_batch(policy_tokenizer))
    assert output.extra["rm_score"] == pytest.approx(by_hand(rm_folder), abs=1e-5)
    # fewer micro-batches than actors: the second has nothing to do
    one = manager(rm_batch(policy_tokenizer, PROMPTS[:1], RESPONSES[:1])).extra["rm_score"]
    assert one == pytest.approx(by_hand(rm_folder, PROMPTS[:1], RESPONSES[:1]), abs=1e-5)
    actors = list(manager._actors)
    manager.close()
    assert manager._actors == []
    for actor in actors:
        assert _dies(actor)


def _dies(actor, tries: int = 100) -> bool:
    # ray.kill is asynchronous: a call sent right after it may still be served
    for _ in range(tries):
        try:
            ray.get(actor.ready.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_dead_actor_fails_its_share_only(ray_cluster, build, rm_folder, policy_tokenizer):
    manager = build(
        model={"path": str(rm_folder)},
        placement="ray",
        num_workers=2,
        micro_batch_size=1,
        on_error="score_zero",
    )
    # micro-batch i goes to actor i mod 2: rows 1 and 3 were the dead actor's
    ray.kill(manager._actors[1], no_restart=True)
    output = manager(rm_batch(policy_tokenizer))
    expected = by_hand(rm_folder)
    scores = output.extra["rm_score"]
    assert scores[0] == pytest.approx(expected[0], abs=1e-5)
    assert scores[2] == pytest.approx(expected[2], abs=1e-5)
    assert scores[1] is None and scores[3] is None
    assert output.metrics["reward/errors"] == 2.0
    assert output.token_level_scores[[1, 3]].abs().sum() == 0
