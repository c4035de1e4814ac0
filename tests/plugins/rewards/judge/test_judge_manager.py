"""The judge reward manager with a scripted judge engine (a test-local engine plugin): prompts,
parsing, normalisation, retries, failures under reward.on_error, prefetch, and the section's
one-line errors."""

from __future__ import annotations

import re

import pytest
import torch

from plugrl.data.dataset import load_tokenizer
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.scoring import ScoringError
from plugrl.plugin.build import build_part
from plugrl.recipe import ModelConfig
from plugrl.testing import make_batch, part_context, save_tiny_model
from tests.plugins.rewards.judge import scripted_judge
from tests.plugins.rewards.judge.scripted_judge import ScriptedJudge

TEMPLATE = "Q: {prompt}\nA: {response}\nRef: {ground_truth}"


@pytest.fixture(scope="module")
def model_folder(plugrl_build_once):
    return plugrl_build_once(save_tiny_model)


@pytest.fixture(scope="module")
def tokenizer(model_folder):
    return load_tokenizer(ModelConfig(path=str(model_folder)))


@pytest.fixture
def judge(plugrl_register_plugin, plugrl_recipe, model_folder, tokenizer):
    """``judge(**reward_keys)``: a judge manager on the scripted engine; closed after the
    test."""
    plugrl_register_plugin(scripted_judge)
    ScriptedJudge.requests.clear()
    built = []

    def make(judge_keys=None, cluster=None, **reward_keys):
        recipe = plugrl_recipe(
            {
                "device.name": "cpu",
                "cluster": cluster or {"mode": "local"},
                "trainer.seed": 3,
                "reward": {
                    "manager": "judge",
                    **reward_keys,
                    "judge": {
                        "model": {"path": str(model_folder)},
                        "engine": "scripted_judge",
                        "template": TEMPLATE,
                        **(judge_keys or {}),
                    },
                },
            }
        )
        manager = build_part(
            "reward_managers", "judge", recipe.reward, part_context(recipe, tokenizer=tokenizer)
        )
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def batch_of(tokenizer, responses, *, n=1, prompts=None, ground_truths=None):
    prompts = prompts or ["What is 2+2?"] * (len(responses) // n)
    return make_batch(
        prompt_ids=[tokenizer.encode(p, add_special_tokens=False) for p in prompts],
        response_ids=[tokenizer.encode(r, add_special_tokens=False) for r in responses],
        n=n,
        ground_truths=ground_truths,
        pad_token_id=tokenizer.pad_token_id,
    )


def last_token_scores(output, batch):
    lengths = batch["response_mask"].sum(dim=-1)
    scores = output.token_level_scores
    for row, length in enumerate(lengths.tolist()):
        assert torch.count_nonzero(scores[row, : length - 1]) == 0
        assert torch.count_nonzero(scores[row, length:]) == 0
    return [round(float(scores[row, length - 1]), 6) for row, length in enumerate(lengths)]


# ------------------------------------------------------------------------------ scoring


def test_scores_are_normalised_and_placed_on_the_last_response_token(judge, tokenizer):
    manager = judge()
    batch = batch_of(tokenizer, ["a good answer", "a bad one, longer than that"])
    output = manager(batch)
    assert last_token_scores(output, batch) == [0.8, 0.2]
    assert output.extra["judge_score"] == [8.0, 2.0]
    assert output.extra["judge_text"] == ["Rating: [[8]]", "Rating: [[2]]"]
    metrics = output.metrics
    assert metrics["reward/judge/mean"] == pytest.approx(0.5)
    assert metrics["reward/judge/std"] == pytest.approx(0.3)
    assert metrics["reward/judge/unparsable"] == 0
    assert metrics["reward/judge/retries"] == 0
    assert metrics["reward/errors"] == 0
    assert metrics["reward/judge/latency_s"] >= 0
    assert metrics["critic/score/mean"] == pytest.approx(0.5)
    assert metrics["critic/score/max"] == pytest.approx(0.8)
    assert metrics["critic/score/min"] == pytest.approx(0.2)


def test_the_judge_sees_the_filled_template_through_its_chat_template(judge, tokenizer):
    manager = judge()
    manager(batch_of(tokenizer, ["good"], prompts=["Add 2 and 2."], ground_truths=["4"]))
    [(prompt, params, _)] = ScriptedJudge.requests
    # the tiny tokenizer's ChatML template, special tokens skipped
    assert prompt == "user\nQ: Add 2 and 2.\nA: good\nRef: 4\nassistant\n"
    assert params.n == 1 and params.temperature == 0 and params.max_tokens == 512
    assert params.seed is not None


def test_the_judge_engine_reads_its_own_rollout_section(judge, tokenizer):
    manager = judge(
        {"rollout": {"prefix": "Fair. ", "top_p": 0.5, "temperature": 0.3}, "max_tokens": 9}
    )
    output = manager(batch_of(tokenizer, ["good"]))
    assert output.extra["judge_text"] == ["Fair. Rating: [[8]]"]
    [(_, params, config)] = ScriptedJudge.requests
    assert (params.temperature, params.top_p, params.max_tokens) == (0.3, 0.5, 9)
    assert config.prefix == "Fair. " and config.colocate is False


def test_score_range_maps_any_scale_and_null_keeps_the_raw_score(judge, tokenizer):
    batch = batch_of(tokenizer, ["good", "bad"])
    assert last_token_scores(judge({"score_range": [2, 12]})(batch), batch) == [0.6, 0.0]
    assert last_token_scores(judge({"score_range": [4, 6]})(batch), batch) == [1.0, 0.0]
    assert last_token_scores(judge({"score_range": None})(batch), batch) == [8.0, 2.0]


def test_identical_samples_are_judged_once(judge, tokenizer):
    manager = judge()
    output = manager(batch_of(tokenizer, ["good", "good", "bad", "good"], n=4))
    assert output.extra["judge_score"] == [8.0, 8.0, 2.0, 8.0]
    assert len(ScriptedJudge.requests) == 2


def test_a_parser_with_options_gets_them(judge, tokenizer):
    manager = judge({"parser": "scaled", "parser_args": {"factor": 0.5}, "score_range": None})
    assert manager(batch_of(tokenizer, ["good"])).extra["judge_score"] == [4.0]


def test_the_template_may_use_extra_info_fields(judge, tokenizer, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("{data_source} A: {response} [{extra_info[hint]}|{extra_info[none]}]")
    manager = judge({"template": None, "template_path": str(template)})
    batch = batch_of(tokenizer, ["good"])
    batch["extra_info"] = [{"hint": "check the sum"}]
    manager(batch)
    assert ScriptedJudge.requests[0][0] == "user\ntest A: good [check the sum|]\nassistant\n"


# ------------------------------------------------------------------------------ retries


def test_an_unreadable_answer_is_asked_again_with_a_new_seed_and_sampling(judge, tokenizer):
    manager = judge({"retry_temperature": 0.7})
    output = manager(batch_of(tokenizer, ["mumble", "good"]))
    assert output.extra["judge_score"] == [5.0, 8.0]
    assert output.extra["judge_text"][0] == "Rating: [[5]]"
    assert output.metrics["reward/judge/unparsable"] == 1
    assert output.metrics["reward/judge/retries"] == 1
    assert output.metrics["reward/errors"] == 0
    first, retry = [params for prompt, params, _ in ScriptedJudge.requests if "mumble" in prompt]
    assert (first.temperature, retry.temperature) == (0.0, 0.7)
    assert first.seed != retry.seed


def test_a_sample_never_readable_fails_the_run_in_one_line(judge, tokenizer):
    manager = judge({"max_retries": 3})
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["good", "never", "never again"]))
    path = manager.judge.model.path
    assert str(caught.value) == (
        f"judge {path!r}: the 'rating' parser found no score in its answer for sample 1 after "
        "3 retries: 'hmm, hard to say' (1 more samples failed); make the template ask for "
        "the parser's form, raise reward.judge.max_retries, or set reward.on_error=fallback"
    )
    assert sum("never" in prompt for prompt, _, _ in ScriptedJudge.requests) == 8


def test_a_long_unreadable_answer_is_cut_in_the_error(judge, tokenizer):
    manager = judge({"rollout": {"prefix": "x" * 100}, "max_retries": 0, "parser": "yes_no"})
    with pytest.raises(ScoringError, match=re.escape(f"'{'x' * 80}...'")):
        manager(batch_of(tokenizer, ["good"]))


@pytest.mark.parametrize(("on_error", "expected"), [("fallback", -1.0), ("score_zero", 0.0)])
def test_failed_samples_score_what_on_error_says_and_are_counted(
    judge, tokenizer, on_error, expected
):
    manager = judge({"max_retries": 1}, on_error=on_error, fallback_score=-1.0)
    batch = batch_of(tokenizer, ["never", "good", "explode"])
    output = manager(batch)
    assert last_token_scores(output, batch) == [expected, 0.8, expected]
    assert output.extra["judge_score"] == [None, 8.0, None]
    assert output.extra["judge_text"] == ["hmm, hard to say", "Rating: [[8]]", ""]
    metrics = output.metrics
    assert metrics["reward/errors"] == 2
    assert metrics["reward/judge/unparsable"] == 1
    assert metrics["reward/judge/retries"] == 1
    assert metrics["reward/judge/mean"] == pytest.approx(0.8)


def test_max_retries_zero_asks_once(judge, tokenizer):
    manager = judge({"max_retries": 0}, on_error="fallback")
    output = manager(batch_of(tokenizer, ["mumble"]))
    assert output.metrics["reward/judge/retries"] == 0
    assert len(ScriptedJudge.requests) == 1


def test_a_failed_judge_request_fails_the_run_in_one_line(judge, tokenizer):
    manager = judge()
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["explode"]))
    assert str(caught.value) == (
        f"judge {manager.judge.model.path!r} failed on sample 0: RuntimeError: the judge ran "
        "out of memory; fix the judge's engine, or set reward.on_error=fallback to score such "
        "samples reward.fallback_score"
    )


def test_a_parser_that_returns_no_number_is_named(judge, tokenizer, plugrl_register_plugin):
    class WordParser:
        @staticmethod
        @scripted_judge.plugrl.hookimpl
        def register_judge_parsers(register):
            register("word", lambda text: "seven")

    plugrl_register_plugin(WordParser)
    manager = judge({"parser": "word"})
    with pytest.raises(PluginError) as caught:
        manager(batch_of(tokenizer, ["good"]))
    assert str(caught.value) == (
        "judge score parser 'word' returned 'seven'; a parser returns a number or None"
    )


# ------------------------------------------------------------------------------ prefetch


def test_prefetched_rows_are_not_asked_again_and_score_the_same(judge, tokenizer):
    responses = ["good", "mumble", "bad", "fine"]
    plain = judge()(batch_of(tokenizer, responses, n=4))
    asked_without = len(ScriptedJudge.requests)
    ScriptedJudge.requests.clear()
    manager = judge()
    batch = batch_of(tokenizer, responses, n=4)
    manager.prefetch(batch.select([0, 1]))
    assert len(manager._prefetched) == 2  # sent, answered on the engine's own thread
    output = manager(batch)
    assert manager._prefetched == {}
    assert len(ScriptedJudge.requests) == asked_without
    assert torch.equal(output.token_level_scores, plain.token_level_scores)
    assert output.extra == plain.extra
    assert output.metrics["reward/judge/retries"] == plain.metrics["reward/judge/retries"]


# ------------------------------------------------------------------------------ the section


@pytest.mark.parametrize(
    ("judge_keys", "message"),
    [
        (
            {"template": "A: {response} {answer}"},
            "reward.judge.template: unknown placeholder {answer}; the template may use "
            "{prompt}, {response}, {ground_truth}, {data_source}, {extra_info}",
        ),
        (
            {"template": "Q: {prompt}"},
            "reward.judge.template: the template has no {response}: the judge would never "
            "see what it scores",
        ),
        (
            {"template": "A: {response} \\boxed{N}"},
            "reward.judge.template: unknown placeholder {N}; the template may use {prompt}, "
            "{response}, {ground_truth}, {data_source}, {extra_info}",
        ),
        (
            {"template": "A: {response"},
            "reward.judge.template: the template is not a format string (expected '}' before "
            "end of string); write a literal brace as {{ or }}",
        ),
        (
            {"template_path": "judge.txt"},
            "reward.judge.template: set reward.judge.template or reward.judge.template_path, "
            "not both",
        ),
        (
            {"template": None, "template_path": "/no/such/file.txt"},
            "reward.judge.template_path: /no/such/file.txt is not a file; give the template's file",
        ),
        (
            {"score_range": [10, 0]},
            "reward.judge.score_range: expected [low, high] with low < high, got [10.0, 0.0]; "
            "or null to keep the raw score",
        ),
        (
            {"rollout": {"engine": "hf"}},
            "reward.judge.rollout.engine: the judge's engine is chosen by reward.judge.engine; "
            "remove it here",
        ),
        (
            {"parser_args": {"strict": True}},
            "reward.judge.parser_args: judge score parser 'rating' takes no options, got strict",
        ),
        (
            {"model": {"path": None}},
            "reward.judge.model.path: the judge needs a model folder; set it to a Hugging Face "
            "model folder",
        ),
        (
            {"model": {"path": "/no/such/judge"}},
            "reward.judge.model.path: /no/such/judge is not a folder; set a local Hugging Face "
            "model folder",
        ),
    ],
)
def test_a_bad_judge_section_stops_the_start_in_one_line(judge, judge_keys, message):
    with pytest.raises(RecipeError) as caught:
        judge(judge_keys)
    assert str(caught.value) == message


def test_an_unknown_judge_rollout_key_is_keyed_under_the_judge(judge):
    with pytest.raises(RecipeError) as caught:
        judge({"rollout": {"prefixx": "x"}})
    assert str(caught.value) == (
        "reward.judge.rollout.prefixx: unknown key; did you mean 'reward.judge.rollout.prefix'?"
    )


def test_an_unknown_parser_is_refused_when_the_recipe_is_read(plugrl_recipe):
    with pytest.raises(RecipeError) as caught:
        plugrl_recipe({"reward": {"manager": "judge", "judge": {"parser": "ratin"}}})
    assert str(caught.value) == (
        "reward.judge.parser: unknown judge score parser 'ratin': did you mean 'rating'? "
        "registered: boxed, number, rating, yes_no"
    )


def test_prefetched_rows_left_out_of_their_batch_are_forgotten(judge, tokenizer):
    manager = judge()
    manager.prefetch(batch_of(tokenizer, ["fine"]))
    manager(batch_of(tokenizer, ["good"]))
    assert len(manager._prefetched) == 1  # kept for one more call: its batch may still come
    manager(batch_of(tokenizer, ["bad"]))
    assert manager._prefetched == {}


def test_a_judge_tokenizer_without_a_chat_template_is_refused(judge, model_folder, tmp_path):
    from plugrl.testing import make_tiny_tokenizer

    plain = make_tiny_tokenizer()
    plain.chat_template = None
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(RecipeError) as caught:
        judge({"model": {"path": str(model_folder), "tokenizer_path": str(tmp_path / "plain")}})
    assert str(caught.value) == (
        f"reward.judge.model: the judge's tokenizer ({tmp_path / 'plain'}) has no chat "
        "template; set reward.judge.model.tokenizer_path to one that has"
    )


def test_the_manager_needs_its_own_section(tokenizer):
    from plugrl.parts.reward import RewardConfig
    from plugrl_judge.manager import JudgeRewardManager

    with pytest.raises(PluginError) as caught:
        JudgeRewardManager(RewardConfig(), part_context(tokenizer=tokenizer))
    assert str(caught.value) == (
        "the judge manager got a RewardConfig reward section; build the recipe with "
        "plugrl.recipe.build_recipe so it is read into JudgeRewardConfig"
    )


@pytest.mark.slow
def test_on_ray_the_judge_runs_in_an_engine_worker_of_its_own(judge, tokenizer):
    import os

    from tests.support import shared_ray_for_module

    with shared_ray_for_module():
        manager = judge({"rollout": {"prefix": "Ray. "}}, cluster={"mode": "ray"})
        assert not manager.engines.in_process
        assert os.getpid() not in manager.engines.engine_pids()
        output = manager(batch_of(tokenizer, ["good", "mumble"]))
        manager.close()
    assert output.extra["judge_text"] == ["Ray. Rating: [[8]]", "Ray. Rating: [[5]]"]
    assert output.metrics["reward/judge/retries"] == 1


def test_rows_prefetched_from_other_threads_score_as_the_batch_would(judge, tokenizer):
    import threading

    responses = ["good", "bad", "fine", "mumble", "good job", "bad luck"]
    plain = judge()(batch_of(tokenizer, responses, n=6))
    manager = judge()
    batch = batch_of(tokenizer, responses, n=6)
    threads = [
        threading.Thread(target=manager.prefetch, args=(batch.select([row]),))
        for row in range(len(responses))
    ]
    for thread in threads:
        thread.start()
    output = manager(batch)
    for thread in threads:
        thread.join()
    assert torch.equal(output.token_level_scores, plain.token_level_scores)
    assert output.extra == plain.extra
