"""Scoring early: rows prefetched while others generate are scored on the manager's thread,
and the batch's call returns exactly what it would have returned without them."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from plugrl.compose.run_parts import build_reward_manager
from plugrl.errors import DataError
from plugrl.parts.scoring import ScoringError
from plugrl_reward_managers import early as early_module
from tests.plugins.rewards.rewards_testlib import make_batch

# every call leaves a line in a log, so a test sees how often each response was scored
LOGGING = """
import time

LOG = {log!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(LOG, "a") as log:
        log.write(solution_str + "\\n")
    if "slow" in solution_str:
        time.sleep(0.3)
    if "hang" in solution_str:
        while True:
            time.sleep(1)
    if "raise" in solution_str:
        raise ZeroDivisionError("division by zero")
    correct = solution_str == ground_truth
    return {{"score": float(correct), "acc": correct, "length": len(solution_str)}}
"""

TEXTS = ["4", "5", "4", "slow 4", "no", "4"]  # the same response twice is scored twice


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "calls.log"
    path.touch()
    return path


@pytest.fixture
def build(make_recipe, tokenizer, plugins, scorer_file, log):
    """build(**reward) -> a manager scoring with LOGGING; every one is closed after."""
    path = scorer_file(LOGGING.format(log=str(log)))
    built = []

    def make(**reward):
        recipe = make_recipe({"custom_function": {"path": str(path)}, **reward})
        manager = build_reward_manager(recipe, tokenizer, plugins)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def calls(log):
    return log.read_text().splitlines()


def batch_of(tokenizer, texts, width=12):
    batch = make_batch(tokenizer, texts, "test", ["4"] * len(texts), width=width)
    batch["extra_info"] = [{"prompt": i // 2} for i in range(len(texts))]
    return batch


def rows(tokenizer, texts, indices):
    """Rows of ``batch_of(texts)`` as generation hands them over: a group at a time, narrower
    (only as wide as its longest response)."""
    whole = batch_of(tokenizer, texts)
    group = make_batch(tokenizer, [texts[i] for i in indices], "test", ["4"] * len(indices))
    group["extra_info"] = [whole["extra_info"][i] for i in indices]
    return group


def wait_scored(manager):
    deadline = time.monotonic() + 60
    while manager._early.unscored():
        assert time.monotonic() < deadline, "prefetched rows were never scored"
        time.sleep(0.01)


def same_output(output, expected):
    assert torch.equal(output.token_level_scores, expected.token_level_scores)
    assert output.extra == expected.extra
    measured = ("perf/",)
    assert {k: v for k, v in output.metrics.items() if not k.startswith(measured)} == {
        k: v for k, v in expected.metrics.items() if not k.startswith(measured)
    }


MANAGERS = [
    {"manager": "naive"},
    {"manager": "dapo", "overlong_buffer": {"enable": True, "len": 4, "log": True}},
    {"manager": "batch"},
    {"manager": "parallel", "num_workers": 2},
]


@pytest.mark.parametrize("reward", MANAGERS, ids=lambda r: r["manager"])
def test_prefetched_rows_are_scored_once_and_the_batch_gets_what_it_would_have(
    build, tokenizer, log, reward
):
    extra = {"max_resp_len": 12} if reward["manager"] == "dapo" else {}
    expected = build(**reward, **extra)(batch_of(tokenizer, TEXTS))
    assert len(calls(log)) == len(TEXTS)
    manager = build(**reward, **extra)
    manager.prefetch(rows(tokenizer, TEXTS, [4, 5]))  # groups finish in any order
    manager.prefetch(rows(tokenizer, TEXTS, [2, 3]))
    manager.prefetch(rows(tokenizer, TEXTS, [0, 1]))
    wait_scored(manager)
    output = manager(batch_of(tokenizer, TEXTS))
    same_output(output, expected)
    assert output.metrics["perf/reward_prefetched"] == 1.0
    assert expected.metrics["perf/reward_prefetched"] == 0.0
    assert sorted(calls(log)) == sorted(TEXTS * 2)  # once without prefetch, once with


def test_a_batch_waits_for_rows_being_scored_and_scores_the_rest_itself(build, tokenizer, log):
    expected = build()(batch_of(tokenizer, TEXTS))
    manager = build()
    manager.prefetch(rows(tokenizer, TEXTS, [2, 3]))  # "slow 4" takes 0.3 s to score
    output = manager(batch_of(tokenizer, TEXTS))
    same_output(output, expected)
    assert 0.0 <= output.metrics["perf/reward_prefetched"] <= 2 / len(TEXTS)
    assert sorted(calls(log)) == sorted(TEXTS * 2)


def test_nothing_prefetched_is_used_by_a_later_batch_of_the_same_responses(build, tokenizer, log):
    manager = build()
    manager.prefetch(rows(tokenizer, TEXTS, range(len(TEXTS))))
    first = manager(batch_of(tokenizer, TEXTS))
    second = manager(batch_of(tokenizer, TEXTS))
    same_output(second, first)
    assert second.metrics["perf/reward_prefetched"] == 0.0
    assert manager._early.pending() == 0
    assert sorted(calls(log)) == sorted(TEXTS * 2)


def test_rows_prefetched_for_a_later_batch_wait_for_it(build, tokenizer, log):
    # a fully-async trainer takes samples some steps after the rollouter prefetched them
    later = ["4", "7"]
    manager = build()
    manager.prefetch(rows(tokenizer, TEXTS, range(len(TEXTS))))
    manager.prefetch(rows(tokenizer, later, [0, 1]))
    wait_scored(manager)
    assert manager(batch_of(tokenizer, TEXTS)).metrics["perf/reward_prefetched"] == 1.0
    assert manager._early.pending() == 2
    assert manager(batch_of(tokenizer, later)).metrics["perf/reward_prefetched"] == 1.0
    assert sorted(calls(log)) == sorted(TEXTS + later)


def test_results_no_batch_takes_are_forgotten(build, tokenizer, log, monkeypatch):
    monkeypatch.setattr(early_module, "FORGET_AFTER_CALLS", 1)
    manager = build()
    manager.prefetch(rows(tokenizer, ["7"], [0]))
    wait_scored(manager)
    manager(batch_of(tokenizer, ["4"]))
    assert manager._early.pending() == 1
    manager(batch_of(tokenizer, ["4"]))
    assert manager._early.pending() == 0
    assert manager(batch_of(tokenizer, ["7"])).metrics["perf/reward_prefetched"] == 0.0
    assert calls(log) == ["7", "4", "4", "7"]


@pytest.mark.parametrize("on_error", ["score_zero", "fallback"])
def test_failed_and_timed_out_prefetched_rows_score_as_without_prefetch(
    build, tokenizer, log, on_error
):
    texts = ["4", "raise", "hang", "5"]
    reward = {"on_error": on_error, "fallback_score": 0.5, "timeout_s": 1.0}
    expected = build(**reward)(batch_of(tokenizer, texts))
    assert (expected.metrics["reward/errors"], expected.metrics["reward/timeouts"]) == (1, 1)
    manager = build(**reward)
    manager.prefetch(rows(tokenizer, texts, [2, 3]))
    manager.prefetch(rows(tokenizer, texts, [0, 1]))
    wait_scored(manager)
    output = manager(batch_of(tokenizer, texts))
    same_output(output, expected)
    assert output.metrics["perf/reward_prefetched"] == 1.0


def test_a_prefetched_row_whose_scorer_raises_stops_the_run_with_the_same_line(
    build, tokenizer, log
):
    texts = ["4", "raise", "5"]
    with pytest.raises(ScoringError) as plain:
        build()(batch_of(tokenizer, texts))
    manager = build()
    manager.prefetch(rows(tokenizer, texts, [0, 1, 2]))
    wait_scored(manager)
    with pytest.raises(ScoringError) as early:
        manager(batch_of(tokenizer, texts))
    assert str(early.value) == str(plain.value)
    assert str(early.value).startswith(
        "reward function for data_source 'test' failed on sample 1: ZeroDivisionError: "
        "division by zero (at reward.py:"
    )


def test_a_scoring_run_that_fails_early_fails_again_in_the_batchs_call(
    make_recipe, tokenizer, plugins, log
):
    # no scorer for the data source: the scoring thread meets the error and the batch's
    # call, scoring the rows itself, stops with it as it would have without prefetch
    manager = build_reward_manager(make_recipe({}), tokenizer, plugins)
    try:
        batch = make_batch(tokenizer, ["4"], "nowhere/unknown", ["4"])
        manager.prefetch(batch)
        wait_scored(manager)
        with pytest.raises(DataError) as early:
            manager(batch)
        with pytest.raises(DataError) as plain:
            manager(batch)
        assert str(early.value) == str(plain.value)
        assert str(early.value).startswith(
            "no reward function for data_source 'nowhere/unknown' (registered: "
        )
    finally:
        manager.close()


def test_rows_prefetched_from_many_threads_while_the_batch_is_scored(build, tokenizer, log):
    texts = [str(i % 7) for i in range(24)]
    expected = build(manager="parallel", num_workers=2)(batch_of(tokenizer, texts))
    for _ in range(3):
        manager = build(manager="parallel", num_workers=2)
        start = threading.Barrier(len(texts) // 2 + 1)

        def hand_over(pair, manager=manager, start=start):
            start.wait()
            manager.prefetch(rows(tokenizer, texts, pair))

        threads = [
            threading.Thread(target=hand_over, args=([i, i + 1],)) for i in range(0, len(texts), 2)
        ]
        for thread in threads:
            thread.start()
        start.wait()
        output = manager(batch_of(tokenizer, texts))  # while the threads hand rows over
        for thread in threads:
            thread.join()
        same_output(output, expected)
        # rows handed over after the batch took its results wait for a later batch
        assert manager._early.pending() <= len(texts)


def test_close_stops_the_scoring_thread(build, tokenizer, log):
    manager = build()
    manager.prefetch(rows(tokenizer, TEXTS, [0, 1]))
    wait_scored(manager)
    threads = [t for t in threading.enumerate() if t.name == "plugrl-reward-naive-early"]
    assert len(threads) == 1
    manager.close()
    assert not threads[0].is_alive()
    assert manager._pool is None


def test_parallel_scores_early_in_a_pool_of_its_own_and_naive_in_its_one_worker(
    build, tokenizer, log
):
    parallel = build(manager="parallel", num_workers=2)
    parallel.prefetch(rows(tokenizer, TEXTS, [0, 1]))
    wait_scored(parallel)
    output = parallel(batch_of(tokenizer, TEXTS))
    assert parallel._early_pool is not None and parallel._early_pool is not parallel._pool
    assert output.metrics["perf/reward_workers"] == 4.0  # two pools of two
    naive = build()
    naive.prefetch(rows(tokenizer, TEXTS, [0, 1]))
    wait_scored(naive)
    output = naive(batch_of(tokenizer, TEXTS))
    assert naive._early_pool is None
    assert output.metrics["perf/reward_workers"] == 1.0
