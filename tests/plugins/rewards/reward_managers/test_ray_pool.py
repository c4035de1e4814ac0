"""``parallel`` with ``backend: ray``: Ray actors with the same per-sample timeouts."""

from __future__ import annotations

import pytest

from plugrl.compose.run_parts import build_reward_manager
from tests.plugins.rewards.rewards_testlib import make_batch
from tests.support import shared_ray_for_module

ray = pytest.importorskip("ray")

SCORER = """
import os
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "raise":
        raise KeyError("missing field")
    return {"score": float(solution_str == ground_truth), "pid": os.getpid()}
"""


@pytest.fixture(scope="module")
def ray_cluster():
    # one local Ray for the module: each test's pool starts and closes its own actors
    with shared_ray_for_module():
        yield


@pytest.mark.slow
def test_ray_actors_score_time_out_and_fail_per_sample(
    ray_cluster, make_recipe, tokenizer, plugins, scorer_file
):
    reward = {
        "manager": "parallel",
        "backend": "ray",
        "num_workers": 2,
        "timeout_s": 2.0,
        "on_error": "score_zero",
        "custom_function": {"path": str(scorer_file(SCORER))},
    }
    manager = build_reward_manager(make_recipe(reward), tokenizer, plugins)
    try:
        manager(make_batch(tokenizer, ["a", "a"], "x", ["a", "a"]))  # start the actors
        texts = ["a", "hang", "b", "raise", "a"]
        output = manager(make_batch(tokenizer, texts, "x", ["a"] * 5))
        # the hang cost its own timeout: its actor killed once, the other samples scored
        killed = manager.pool().killed
    finally:
        manager.close()
    assert killed == 1
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert output.metrics["reward/timeouts"] == 1.0
    assert output.metrics["reward/errors"] == 1.0
    assert len({pid for pid in output.extra["pid"] if pid is not None}) >= 1


WAITS = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.2)  # a remote check: the core idles meanwhile
    return 1.0
"""


@pytest.mark.slow
def test_ray_actors_grow_while_calls_wait(ray_cluster, scorer_file):
    from plugrl.parts.scoring import FileFunction, Scorer
    from plugrl.rewards.workers import Call
    from plugrl_reward_managers.ray_pool import RayPool

    scorer = Scorer.wrap(FileFunction(str(scorer_file(WAITS)), "compute_score"), "waits")
    sample = {"data_source": "x", "solution_str": "a", "ground_truth": "a", "extra_info": None}
    pool = RayPool(1, max_workers=3)
    try:
        for _ in range(2):
            outcomes = pool.run([[Call(scorer, sample, 30.0)] for _ in range(6)])
        assert all(task[0].ok for task in outcomes)
        assert pool.target_workers == 3 and len(pool.actors) == 3
    finally:
        pool.close()
