"""The judge on the real hf engine and a tiny model: its answers come back, are parsed (the
untrained model writes gibberish, so parsing fails) the same way for the same seed, retries
are counted and the fallback applied."""

from __future__ import annotations

import pytest

from plugrl.data.dataset import load_tokenizer
from plugrl.plugin.build import build_part
from plugrl.recipe import ModelConfig
from plugrl.testing import make_batch, part_context, save_tiny_model


@pytest.fixture(scope="module")
def model_folder(plugrl_build_once):
    return plugrl_build_once(save_tiny_model)


@pytest.fixture
def hf_judge(plugrl_recipe, model_folder):
    built = []
    tokenizer = load_tokenizer(ModelConfig(path=str(model_folder)))

    def make(**judge_keys):
        recipe = plugrl_recipe(
            {
                "device.name": "cpu",
                "reward": {
                    "manager": "judge",
                    "on_error": "fallback",
                    "fallback_score": -1.0,
                    "judge": {
                        "model": {"path": str(model_folder), "dtype": "float32"},
                        "template": "Answer: {response}\nRate it.",
                        "max_tokens": 6,
                        "max_retries": 1,
                        **judge_keys,
                    },
                },
            }
        )
        context = part_context(recipe, tokenizer=tokenizer)
        manager = build_part("reward_managers", "judge", recipe.reward, context)
        built.append(manager)
        return manager

    yield make, tokenizer
    for manager in built:
        manager.close()


def test_the_hf_judge_answers_and_unparsable_answers_fall_back(hf_judge):
    make, tokenizer = hf_judge
    responses = ["4", "The sum is 4.", "4"]
    batch = make_batch(
        prompt_ids=[tokenizer.encode("What is 2+2?", add_special_tokens=False)],
        response_ids=[tokenizer.encode(r, add_special_tokens=False) for r in responses],
        n=3,
        pad_token_id=tokenizer.pad_token_id,
    )
    manager = make()
    assert manager.engines.in_process
    output = manager(batch)
    texts = output.extra["judge_text"]
    assert all(isinstance(text, str) and text for text in texts)
    assert texts[0] == texts[2]  # the same sample, judged once
    # an untrained model writes no "Rating: [[N]]"
    assert output.extra["judge_score"] == [None, None, None]
    assert output.metrics["reward/judge/unparsable"] == 2
    assert output.metrics["reward/judge/retries"] == 2
    assert output.metrics["reward/errors"] == 3
    assert output.metrics["critic/score/mean"] == -1.0

    again = make()(batch)
    assert again.extra == output.extra  # the same seed, the same answers


def test_the_hf_judge_gives_a_number_parser_the_same_answers_every_time(hf_judge):
    make, tokenizer = hf_judge
    batch = make_batch(
        prompt_ids=[tokenizer.encode("Count to 3.", add_special_tokens=False)],
        response_ids=[tokenizer.encode(r, add_special_tokens=False) for r in ("1 2 3", "3")],
        n=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    first = make(parser="number", max_tokens=12, score_range=None)(batch)
    second = make(parser="number", max_tokens=12, score_range=None)(batch)
    assert first.extra == second.extra
    assert first.metrics["reward/judge/retries"] == second.metrics["reward/judge/retries"]
    assert first.metrics["reward/errors"] == sum(s is None for s in first.extra["judge_score"])
