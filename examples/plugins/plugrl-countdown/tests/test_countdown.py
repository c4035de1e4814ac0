"""Tests of plugrl-countdown, run against the installed package with plugrl's test kit:
``pip install .`` then ``pytest`` in this folder."""

import pytest

import plugrl_countdown
from plugrl.compose.run_parts import build_reward_manager
from plugrl.errors import RecipeError
from plugrl.parts.scoring import make_resolver
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import explain
from plugrl.testing import make_batch
from plugrl_countdown.scoring import compute_score

TRUTH = {"target": 24, "numbers": [3, 5, 8, 2]}


def test_the_installed_package_registers_countdown(plugrl_plugin_manager, plugrl_register_plugin):
    # installed, the entry point registered it already: register() keeps that registration
    plugrl_register_plugin(plugrl_countdown)
    row = next(r for r in plugrl_plugin_manager.describe() if r["name"] == "countdown")
    assert row["distribution"] == "plugrl-countdown"
    entry = plugrl_plugin_manager.registry("reward_functions").match("countdown")
    assert entry.load() is compute_score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("think... <answer>(5 - 3) * 8 + 8 - 8 + 2 * 0</answer>", 0.1),  # numbers not given
        ("<answer>(8 - 2) * (5 - 3) * 2</answer>", 0.1),  # 24, but 2 used twice
        ("<answer>8 * 3 + 5 - 2 - 3</answer>", 0.1),  # 24, but 3 used twice
        ("<answer>(5 + 3) * 2</answer>", 0.1),  # 8 left out
        ("<answer>(5 + 3) * 2 + 8</answer>", 1.0),
        ("first <answer>1</answer> then <answer>2 * 8 + (3 + 5)</answer>", 1.0),
        ("<answer>2 * 8 + (3 + 5)</answer> but then <answer>24</answer>", 0.1),  # last counts
        ("no tag here", 0.0),
        ("<answer>__import__('os').system('true')</answer>", 0.1),  # parsed, never run
    ],
)
def test_scores(response, score):
    assert compute_score("countdown", response, TRUTH)["score"] == score


def test_options_reach_the_function_from_the_recipe(plugrl_recipe):
    recipe = plugrl_recipe(
        {
            "reward.function_args.countdown": {
                "correct_score": 2.0,
                "format_score": 0.5,
                "use_all_numbers": False,
            }
        }
    )
    scorer = make_resolver(recipe, get_plugin_manager())("countdown")
    assert scorer.kwargs == {"correct_score": 2.0, "format_score": 0.5, "use_all_numbers": False}
    # use_all_numbers false: 3 * 8 may leave 5 and 2 out, but no number may be used twice
    assert scorer("countdown", "<answer>3 * 8</answer>", TRUTH)["score"] == 2.0
    assert scorer("countdown", "<answer>3 * 8 * 8</answer>", TRUTH)["score"] == 0.5
    assert make_resolver(plugrl_recipe(), get_plugin_manager())("countdown")(
        "countdown", "<answer>3 * 8</answer>", TRUTH
    )["score"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"format_scor": 0.2},
            "reward.function_args.countdown.format_scor: unknown key; did you mean "
            "'reward.function_args.countdown.format_score'?",
        ),
        (
            {"format_score": 1.5},
            "reward.function_args.countdown.format_score: must be below correct_score (1.0), "
            "got 1.5",
        ),
    ],
)
def test_a_bad_option_is_one_line_naming_the_key(plugrl_recipe, options, message):
    with pytest.raises(RecipeError) as info:
        plugrl_recipe({"reward.function_args.countdown": options})
    assert str(info.value) == message


def test_explain_describes_the_options(plugrl_plugin_manager):
    info = explain("reward.function_args.countdown.use_all_numbers", plugrl_plugin_manager)
    assert (info.type, info.default) == ("bool", True)
    assert info.help.startswith("Every given number must be used exactly once")
    assert info.owner == "reward function countdown (countdown)"


class CharTokenizer:
    """One token per character: enough for a reward manager to decode responses."""

    pad_token_id = 0

    def encode(self, text):
        return [ord(char) for char in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_a_reward_manager_scores_a_batch_with_the_options(plugrl_recipe):
    tokenizer = CharTokenizer()
    responses = ["<answer>3 * 8</answer>", "<answer>(5 + 3) * 2 + 8</answer>", "no", ""]
    batch = make_batch(
        prompt_ids=[tokenizer.encode("24 from 3 5 8 2"), tokenizer.encode("again")],
        response_ids=[tokenizer.encode(text) for text in responses],
        n=2,
        data_source="countdown",
        ground_truths=[TRUTH, TRUTH],
    )
    recipe = plugrl_recipe({"reward.function_args.countdown.format_score": 0.25})
    manager = build_reward_manager(recipe, tokenizer, get_plugin_manager())
    try:
        manager.check_data_sources(["countdown"])
        output = manager(batch)
    finally:
        manager.close()
    assert output.token_level_scores.sum(dim=-1).tolist() == [0.25, 1.0, 0.0, 0.0]
    assert output.extra["acc"] == [0.0, 1.0, 0.0, 0.0]
    assert output.metrics["reward/countdown/acc"] == 0.25
