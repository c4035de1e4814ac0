"""The reward managers, built from recipes the way a run builds them."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from plugrl.compose.run_parts import build_reward_manager
from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError
from plugrl.parts.reward import RewardOutput
from plugrl.parts.scoring import ScoringError
from plugrl.testing import part_context
from plugrl_reward_managers.managers import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    ParallelRewardManager,
    overlong_penalty,
)
from tests.plugins.rewards.rewards_testlib import EOS, make_batch

ARITH = "plugrl/arithmetic"

FLAKY = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "hang" in solution_str:
        while True:
            time.sleep(1)
    if "raise" in solution_str:
        raise ZeroDivisionError("division by zero")
    return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth}
"""

BATCH_COUNTING = """
CALLS = 0

def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    global CALLS
    CALLS += 1
    return [{"score": float(s == g), "call": CALLS} for s, g in zip(solution_strs, ground_truths)]
"""


@pytest.fixture
def build(make_recipe, tokenizer, plugins):
    """build(reward={...}) -> a reward manager; every one is closed after the test."""
    built = []

    def make(reward=None, max_response_length=64, tok=None):
        recipe = make_recipe(reward, max_response_length=max_response_length)
        manager = build_reward_manager(recipe, tok or tokenizer, plugins)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def custom(path, **extra):
    return {"custom_function": {"path": str(path)}, **extra}


# ------------------------------------------------------------------------------ naive


def test_naive_puts_each_score_on_the_last_valid_token(build, tokenizer):
    manager = build()
    assert isinstance(manager, NaiveRewardManager)
    texts = ["Answer: 4", "Answer: 5", "no answer", "2 + 2\nAnswer: 4"]
    batch = make_batch(tokenizer, texts, ARITH, ["4", "4", "4", "4"], width=20)
    output = manager(batch)
    assert isinstance(output, RewardOutput)
    scores = output.token_level_scores
    assert scores.shape == (4, 20) and scores.dtype == torch.float32
    lengths = batch["response_mask"].sum(-1)
    for row, expected in enumerate([1.0, 0.0, 0.0, 1.0]):
        assert scores[row, lengths[row] - 1] == expected  # the eos token closes the response
        assert scores[row].sum() == expected
    assert output.extra == {
        "score": [1.0, 0.0, 0.0, 1.0],
        "acc": [True, False, False, True],
        "pred": ["4", "5", None, "4"],
    }
    assert output.metrics["critic/score/mean"] == 0.5
    assert output.metrics["critic/score/max"] == 1.0
    assert output.metrics["critic/score/min"] == 0.0
    assert output.metrics[f"reward/{ARITH}/acc"] == 0.5
    assert output.metrics["reward/errors"] == 0.0
    assert output.metrics["reward/timeouts"] == 0.0


def test_decoding_skips_special_tokens_and_padding(build, tokenizer):
    manager = build()
    batch = make_batch(tokenizer, ["Answer: 7"], ARITH, ["7"], width=15)
    assert batch["responses"][0, 9] == EOS
    assert manager.decode(batch["responses"], batch["response_mask"]) == ["Answer: 7"]


def test_per_data_source_metrics(build, tokenizer):
    manager = build()
    texts = ["Answer: 4", "Answer: 3", "#### 10", "#### 11", "\\boxed{B}"]
    sources = [ARITH, ARITH, "openai/gsm8k", "openai/gsm8k", "multiple_choice"]
    output = manager(make_batch(tokenizer, texts, sources, ["4", "4", "10", "10", "B"]))
    assert output.metrics[f"reward/{ARITH}/acc"] == 0.5
    assert output.metrics["reward/openai/gsm8k/acc"] == 0.5
    assert output.metrics["reward/multiple_choice/acc"] == 1.0
    assert output.metrics["reward/openai/gsm8k/score"] == 0.5
    assert "reward/openai/gsm8k/pred" not in output.metrics


def test_an_empty_response_keeps_its_score_on_token_zero(build, tokenizer):
    manager = build()
    batch = make_batch(tokenizer, ["", "Answer: 1"], ARITH, ["1", "1"], eos=False, width=12)
    output = manager(batch)
    assert output.token_level_scores[0].tolist() == [0.0] * 12
    assert output.token_level_scores[1, 8] == 1.0


def test_missing_columns_are_named(build):
    batch = Batch(tensors={"responses": torch.zeros(1, 3, dtype=torch.long)})
    with pytest.raises(KeyError, match="reward manager 'naive' needs batch columns response_mask"):
        build()(batch)


def test_unknown_data_source_fails_at_start_up(build):
    with pytest.raises(DataError) as error:
        build().check_data_sources([ARITH, "openai/gsm8k", "my_lab/puzzles"])
    assert str(error.value).startswith("no reward function for data_source 'my_lab/puzzles'")
    assert "reward.custom_function.path=FILE.py" in str(error.value)


def test_a_resolver_returning_plain_functions_is_accepted(make_recipe, tokenizer):
    from plugrl_scorers.arithmetic import compute_score

    recipe = make_recipe()
    manager = NaiveRewardManager(recipe.reward, part_context(recipe, tokenizer=tokenizer))
    manager.resolve = lambda _: compute_score
    try:
        output = manager(make_batch(tokenizer, ["Answer: 2"], "anything", ["2"]))
    finally:
        manager.close()
    assert output.extra["acc"] == [True]


# ------------------------------------------------------------------------------ failures


def test_a_scorer_that_never_returns_does_not_stop_the_batch(build, tokenizer, scorer_file):
    manager = build(custom(scorer_file(FLAKY), timeout_s=1.0))
    texts = ["a", "hang", "b", "a"]
    output = manager(make_batch(tokenizer, texts, "x", ["a", "a", "b", "b"]))
    # one timeout paid: the hung sample's worker killed and replaced once, the samples after
    # it scored by the replacement
    assert manager.pool().killed == 1
    assert manager.pool().started == 2
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert output.metrics["reward/timeouts"] == 1.0
    assert output.metrics["reward/errors"] == 0.0
    assert output.metrics["reward/x/acc"] == 0.5  # the timed-out sample counts as wrong
    assert output.extra["acc"] == [True, None, True, False]


def test_on_error_raise_names_data_source_sample_and_exception(build, tokenizer, scorer_file):
    manager = build(custom(scorer_file(FLAKY)))
    batch = make_batch(tokenizer, ["a", "raise", "raise"], "my/source", ["a", "a", "a"])
    with pytest.raises(ScoringError) as error:
        manager(batch)
    message = str(error.value)
    assert message.startswith(
        "reward function for data_source 'my/source' failed on sample 1: ZeroDivisionError: "
        "division by zero (at reward.py:"
    )
    assert "(1 more samples failed); fix the function, or set reward.on_error=score_zero" in message
    assert "\n" not in message


def test_on_error_score_zero_counts_errors(build, tokenizer, scorer_file):
    manager = build(custom(scorer_file(FLAKY), on_error="score_zero"))
    batch = make_batch(tokenizer, ["a", "raise", "a"], "x", ["a", "a", "a"])
    output = manager(batch)
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert output.metrics["reward/errors"] == 1.0
    assert output.metrics["reward/timeouts"] == 0.0


def test_on_error_fallback_scores_failures_with_the_fallback_score(
    build, tokenizer, scorer_file, caplog
):
    manager = build(custom(scorer_file(FLAKY), on_error="fallback", fallback_score=0.5))
    batch = make_batch(tokenizer, ["a", "raise", "a"], "x", ["a", "a", "a"])
    output = manager(batch)
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.5, 1.0]
    assert output.metrics["reward/errors"] == 1.0
    assert "1 of 3 samples failed and were scored 0.5" in caplog.text


def test_a_bad_ground_truth_is_an_error_of_its_sample(build, tokenizer):
    batch = make_batch(tokenizer, ["Answer: 1", "Answer: 1"], ARITH, ["1", "one"])
    with pytest.raises(ScoringError, match="failed on sample 1: ValueError: ground truth 'one'"):
        build()(batch)


def test_the_recipe_rejects_an_unknown_on_error(make_recipe):
    with pytest.raises(
        RecipeError, match=r"reward\.on_error: must be one of raise, score_zero, fallback"
    ):
        make_recipe({"on_error": "ignore"})


# ------------------------------------------------------------------------------ dapo


@pytest.mark.parametrize(
    ("length", "penalty"),
    [
        (0, 0.0),
        (11, 0.0),  # below the buffer
        (12, 0.0),  # expected = 16 - 4: the buffer starts here
        (13, -0.25),
        (14, -0.5),
        (16, -1.0),  # at max_resp_len: the full penalty factor
        (18, -1.5),  # past it (a response longer than max_resp_len keeps growing)
    ],
)
def test_overlong_penalty_at_and_around_its_edges(length, penalty):
    assert overlong_penalty(length, max_resp_len=16, buffer_len=4, penalty_factor=1.0) == penalty


def test_overlong_penalty_scales_with_the_factor_and_works_on_tensors():
    lengths = torch.tensor([12.0, 14.0, 16.0])
    penalties = overlong_penalty(lengths, max_resp_len=16, buffer_len=4, penalty_factor=0.5)
    assert penalties.tolist() == [0.0, -0.25, -0.5]


def overlong(enable=True, length=4, factor=1.0, log=True, **extra):
    buffer = {"enable": enable, "len": length, "penalty_factor": factor, "log": log}
    return {"manager": "dapo", "overlong_buffer": buffer, **extra}


def test_dapo_adds_the_overlong_penalty_to_the_score(build, tokenizer):
    manager = build(overlong(max_resp_len=16))
    assert isinstance(manager, DAPORewardManager)
    # response lengths with the eos token: 10, 13, 16; the buffer starts after 12
    texts = ["Answer: 4", "..\nAnswer: 4", ".....\nAnswer: 4"]
    output = manager(make_batch(tokenizer, texts, "aime2024", ["4"] * 3))
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.75, 0.0]
    assert output.extra["score"] == [1.0, 1.0, 1.0]  # the raw scores stay in the column
    assert output.extra["overlong_reward"] == [0.0, -0.25, -1.0]
    assert output.extra["overlong"] == [False, True, True]
    assert output.metrics["reward/overlong/ratio"] == pytest.approx(2 / 3)
    assert output.metrics["reward/overlong/penalty_mean"] == pytest.approx(-1.25 / 3)
    assert output.metrics["critic/score/mean"] == pytest.approx(1.75 / 3)


def test_dapo_without_the_buffer_is_naive_with_plus_minus_one(build, tokenizer):
    manager = build(overlong(enable=False))
    output = manager(make_batch(tokenizer, ["Answer: 4", "Answer: 5"], "math", ["4", "4"]))
    assert output.token_level_scores.sum(-1).tolist() == [1.0, -1.0]
    assert "overlong_reward" not in output.extra


def test_dapo_max_resp_len_defaults_to_the_data_limit(build):
    assert build(overlong(), max_response_length=300).max_resp_len == 300


def test_dapo_rejects_an_empty_or_too_long_buffer(build):
    with pytest.raises(RecipeError) as error:
        build(overlong(length=0))
    assert str(error.value).startswith(
        "reward.overlong_buffer.len: must be > 0 when the overlong buffer is enabled"
    )
    with pytest.raises(RecipeError) as error:
        build(overlong(length=100, max_resp_len=64))
    assert str(error.value) == (
        "reward.overlong_buffer.len: 100 is longer than max_resp_len 64; make it smaller or "
        "raise reward.max_resp_len"
    )


def test_overlong_keys_belong_to_the_dapo_manager(make_recipe):
    with pytest.raises(RecipeError, match=r"reward\.overlong_buffer: unknown key"):
        make_recipe({"manager": "naive", "overlong_buffer": {"enable": True}})
    with pytest.raises(
        RecipeError, match=r"did you mean 'reward\.overlong_buffer\.penalty_factor'"
    ):
        make_recipe({"manager": "dapo", "overlong_buffer": {"penalty_factr": 1.0}})


# ------------------------------------------------------------------------------ batch


def test_batch_manager_calls_a_batch_function_once(build, tokenizer, scorer_file):
    manager = build(custom(scorer_file(BATCH_COUNTING), manager="batch"))
    assert isinstance(manager, BatchRewardManager)
    output = manager(make_batch(tokenizer, ["1", "2", "3"], "x", ["1", "1", "3"]))
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert output.extra["call"] == [1, 1, 1]
    output = manager(make_batch(tokenizer, ["1"], "x", ["1"]))
    assert output.extra["call"] == [2]


def test_batch_manager_scores_per_sample_functions_too(build, tokenizer):
    manager = build({"manager": "batch"})
    texts = ["Answer: 4", "#### 7", "Answer: 5"]
    output = manager(make_batch(tokenizer, texts, [ARITH, "openai/gsm8k", ARITH], ["4", "7", "4"]))
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.0]


def test_batch_call_past_its_timeout_times_out_every_sample(build, tokenizer, scorer_file):
    path = scorer_file(
        "import time\n\n"
        "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
        "    time.sleep(60)\n"
    )
    manager = build(custom(path, manager="batch", batch_timeout_s=0.5))
    output = manager(make_batch(tokenizer, ["1", "2"], "x", ["1", "1"]))
    assert output.metrics["reward/timeouts"] == 2.0
    assert output.token_level_scores.sum().item() == 0.0


def test_per_sample_managers_refuse_a_batch_function(build, scorer_file):
    manager = build(custom(scorer_file(BATCH_COUNTING)))
    with pytest.raises(RecipeError) as error:
        manager.check_data_sources(["x"])
    assert str(error.value).endswith(
        "takes whole batches (solution_strs); the 'naive' manager scores one sample per call: "
        "set reward.manager=batch"
    )


# ------------------------------------------------------------------------------ parallel


def test_parallel_scores_in_several_processes_in_order(build, tokenizer, scorer_file):
    path = scorer_file(
        "import os\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'pid': os.getpid()}\n"
    )
    manager = build(custom(path, manager="parallel", num_workers=2, chunk_size=2))
    assert isinstance(manager, ParallelRewardManager)
    texts = [str(i % 3) for i in range(12)]
    output = manager(make_batch(tokenizer, texts, "x", ["0"] * 12))
    assert output.token_level_scores.sum(-1).tolist() == [float(t == "0") for t in texts]
    assert len(set(output.extra["pid"])) == 2


HANG_TOGETHER = """
import os
import time

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("hang "):  # hang, noting whether another hangs meanwhile
        folder = solution_str[len("hang "):]
        with open(os.path.join(folder, str(os.getpid())), "w"):
            pass
        while True:
            for name in os.listdir(folder):
                if name.isdigit() and int(name) != os.getpid() and alive(int(name)):
                    with open(os.path.join(folder, "overlapped"), "w"):
                        pass
            time.sleep(0.01)
    return float(solution_str == ground_truth)
"""


def test_parallel_hang_costs_one_timeout(build, tokenizer, scorer_file, tmp_path):
    manager = build(
        custom(scorer_file(HANG_TOGETHER), manager="parallel", num_workers=2, timeout_s=1.0)
    )
    manager(make_batch(tokenizer, ["a", "a"], "x", ["a", "a"]))  # start both workers
    hang = f"hang {tmp_path}"
    texts = [hang, "a", "a", hang, "a", "a"]
    output = manager(make_batch(tokenizer, texts, "x", ["a"] * 6))
    assert output.metrics["reward/timeouts"] == 2.0
    assert output.token_level_scores.sum(-1).tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    # the two hangs ran at the same time, in the two workers, so together they cost one
    # timeout's wait; each worker was killed once and replaced once
    assert (tmp_path / "overlapped").exists(), "the second hang started after the first ended"
    assert manager.pool().killed == 2
    assert manager.pool().started == 4


def test_parallel_worker_count_starts_at_the_cpus_and_may_grow(build, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    manager = build({"manager": "parallel"})
    assert (manager.num_workers(), manager.max_workers()) == (2, 32)
    pool = manager.pool()
    assert (pool.sizing.base, pool.sizing.maximum) == (2, 32)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert build({"manager": "parallel", "max_workers": 4}).num_workers() == 8  # at most 8
    assert build({"manager": "parallel", "max_workers": 4}).max_workers() == 8
    fixed = build({"manager": "parallel", "num_workers": 3, "max_workers": 16})
    assert (fixed.num_workers(), fixed.max_workers()) == (3, 3)


WAITS = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.25)  # a remote check, a sandbox: the core idles meanwhile
    return float(solution_str == ground_truth)
"""


def hints_of(caplog, manager, batch, times=2) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        for _ in range(times):
            output = manager(batch)
    assert 0.0 <= output.metrics["perf/reward_busy_fraction"] < 0.5
    return [r.getMessage() for r in caplog.records if "rather than computing" in r.getMessage()]


def test_slow_waiting_calls_in_the_naive_manager_name_the_parallel_manager(
    build, tokenizer, scorer_file, caplog
):
    manager = build(custom(scorer_file(WAITS)))
    batch = make_batch(tokenizer, ["a"] * 5, "x", ["a"] * 5)  # over a second of waiting
    (hint,) = hints_of(caplog, manager, batch)  # said once, not every batch
    assert hint.startswith("reward: scoring a batch took ")
    assert hint.endswith(
        "of their time (I/O, a remote service, a sleep) rather than computing; the naive manager "
        "scores one sample at a time; reward.manager=parallel scores samples concurrently"
    )


def test_slow_waiting_calls_name_the_worker_count_that_holds_them_back(
    build, tokenizer, scorer_file, caplog
):
    manager = build(custom(scorer_file(WAITS), manager="parallel", num_workers=1, chunk_size=1))
    (hint,) = hints_of(caplog, manager, make_batch(tokenizer, ["a"] * 5, "x", ["a"] * 5))
    assert hint.endswith(
        "rather than computing; reward.num_workers=1 caps the workers scoring at once; raise "
        "it, or unset it to let the pool grow while the calls wait"
    )


def test_slow_waiting_calls_name_max_workers_once_the_pool_reached_it(
    build, tokenizer, scorer_file, caplog, monkeypatch
):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    reward = custom(scorer_file(WAITS), manager="parallel", max_workers=2, chunk_size=1)
    manager = build(reward)
    batch = make_batch(tokenizer, ["a"] * 9, "x", ["a"] * 9)
    (hint,) = hints_of(caplog, manager, batch)
    assert hint.endswith("rather than computing; the pool is at reward.max_workers=2; raise it")
    assert manager(batch).metrics["perf/reward_workers"] == 2.0


def test_no_hint_where_no_key_would_score_more_at_once(build, tokenizer, scorer_file, caplog):
    batch = make_batch(tokenizer, ["a"] * 5, "x", ["a"] * 5)
    dapo = build(custom(scorer_file(WAITS), manager="dapo"))
    assert hints_of(caplog, dapo, batch, times=1) == []
    # a pool that may still grow: it grows instead
    growing = build(custom(scorer_file(WAITS), manager="parallel", chunk_size=1))
    assert hints_of(caplog, growing, batch, times=1) == []


def test_compute_bound_scoring_says_nothing_and_reports_busy_calls(build, tokenizer, caplog):
    manager = build({"manager": "parallel", "num_workers": 1})
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        output = manager(make_batch(tokenizer, ["Answer: 4"] * 3, ARITH, ["4"] * 3))
    assert output.metrics["perf/reward_workers"] == 1.0
    assert 0.0 <= output.metrics["perf/reward_busy_fraction"] <= 1.0
    assert not [r for r in caplog.records if "rather than computing" in r.getMessage()]


# ------------------------------------------------------------------------------ a real tokenizer


def test_with_a_real_byte_level_bpe_tokenizer(build):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["Answer: 12", "17 + 25 = 42", "我们先计算。", "Answer: 1,234."] * 20
    model.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>"
    )
    texts = ["我们先计算 17 + 25。\nAnswer: 42", "Answer: 41"]
    rows = [[*tokenizer.encode(t), tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows)) + 3
    responses = torch.full((2, width), tokenizer.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, row in enumerate(rows):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    batch = Batch(
        tensors={"responses": responses, "response_mask": mask},
        columns={"data_source": [ARITH] * 2, "ground_truth": ["42", "42"], "extra_info": [{}, {}]},
    )
    manager = build(tok=tokenizer)
    assert manager.decode(responses, mask) == texts
    output = manager(batch)
    assert output.token_level_scores[0, len(rows[0]) - 1] == 1.0
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0]


def test_an_async_function_in_the_worker_with_a_timeout(build, tokenizer, scorer_file):
    path = scorer_file(
        "import asyncio\n\n"
        "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str == 'slow':\n"
        "        await asyncio.sleep(3600)\n"
        "    await asyncio.sleep(0.01)\n"
        "    return float(solution_str == ground_truth)\n"
    )
    manager = build(custom(path, timeout_s=0.5))
    output = manager(make_batch(tokenizer, ["a", "slow", "b"], "x", ["a", "a", "b"]))
    assert output.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert output.metrics["reward/timeouts"] == 1.0
