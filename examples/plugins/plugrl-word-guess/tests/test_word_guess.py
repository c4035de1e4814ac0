"""Tests of plugrl-word-guess, run against the installed package with plugrl's test kit:
``pip install .`` then ``pytest`` in this folder."""

import asyncio

import pytest

import plugrl_word_guess
from plugrl.errors import RecipeError
from plugrl.recipe import explain, part_args
from plugrl.testing import ScriptedSession, make_tiny_tokenizer, part_context
from plugrl_word_guess.env import WordGuessEnvironment, hint, make_rows, read_guess
from plugrl_word_guess.options import WordGuessOptions

ROW = {"extra_info": {"word": "grape"}}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def test_the_installed_package_registers_word_guess(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(plugrl_word_guess)
    row = next(r for r in plugrl_plugin_manager.describe() if r["name"] == "word_guess")
    assert row["distribution"] == "plugrl-word-guess"
    entry = plugrl_plugin_manager.registry("environments").get("word_guess")
    assert entry.load() is WordGuessEnvironment
    assert entry.load_config() is WordGuessOptions


@pytest.mark.parametrize(
    ("guess", "word", "marks"),
    [
        ("dream", "grape", "_ R e a _"),
        ("grape", "grape", "G R A P E"),
        ("eerie", "grape", "_ _ r _ E"),  # one e in the word: only the one in place is marked
        ("apple", "grape", "a p _ _ E"),  # two p guessed, one in the word
    ],
)
def test_hints(guess, word, marks):
    assert hint(guess, word) == marks


def test_the_last_guess_tag_counts():
    assert read_guess("maybe <guess>Stone</guess> or <guess> grape </guess>") == "grape"
    assert read_guess("grape") is None


def game(plugrl_recipe, tokenizer, replies, **env_args):
    """One episode played by plugrl's env agent loop with scripted model turns."""
    recipe = plugrl_recipe(
        {"rollout.agent": {"loop": "env", "env": "word_guess", "env_args": env_args}}
    )
    context = part_context(recipe)
    loop_class = context.plugins.registry("agent_loops").get("env").load()
    options = part_args(recipe, "rollout", "agent.env_args", context.plugins)
    session = ScriptedSession(
        tokenizer,
        replies,
        environment=lambda: WordGuessEnvironment(options, context),
        config=recipe.rollout.agent,
    )
    return asyncio.run(loop_class(None, context).run(ROW, session))


def test_a_game_played_by_the_env_loop(plugrl_recipe, tokenizer):
    trajectory = game(
        plugrl_recipe,
        tokenizer,
        ["<guess>dream</guess>", "no idea", "<guess>grape</guess>"],
        letter_reward=0.5,
    )
    assert trajectory.finish_reason == "stop"
    assert [m["content"] for m in trajectory.messages[1:]] == [
        "<guess>dream</guess>",
        "_ R e a _",
        "no idea",
        "End your answer with <guess>word</guess>, a 5-letter word.",
        "<guess>grape</guess>",
    ]
    # 1 of 5 letters in place, no guess, the word
    assert trajectory.turn_rewards == pytest.approx([0.1, 0.0, 1.0])
    assert trajectory.reward == pytest.approx(1.1)
    assert (trajectory.metrics["env/solved"], trajectory.metrics["env/guesses"]) == (1.0, 3.0)
    # the hints are the environment's, not the model's: no loss on them
    assert 0 in trajectory.loss_mask and trajectory.loss_mask[-1] == 1


def test_after_max_guesses_the_word_is_told_and_the_game_ends(plugrl_recipe, tokenizer):
    trajectory = game(plugrl_recipe, tokenizer, ["<guess>stone</guess>"] * 3, max_guesses=2)
    assert (trajectory.num_turns, trajectory.finish_reason) == (2, "stop")
    assert trajectory.metrics["env/solved"] == 0.0


def test_a_word_that_is_not_letters_is_refused_in_one_line(plugrl_recipe):
    recipe = plugrl_recipe({"rollout.agent": {"loop": "env", "env": "word_guess"}})
    env = WordGuessEnvironment(WordGuessOptions(), part_context(recipe))
    with pytest.raises(ValueError) as info:
        asyncio.run(env.reset({"extra_info": {"word": "two words"}}))
    assert str(info.value) == "extra_info.word must be letters only, got 'two words'"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"letter_rewrd": 0.2},
            "rollout.agent.env_args.letter_rewrd: unknown key; did you mean "
            "'rollout.agent.env_args.letter_reward'?",
        ),
        (
            {"letter_reward": 1.5},
            "rollout.agent.env_args.letter_reward: must be below solve_reward (1.0), got 1.5",
        ),
    ],
)
def test_a_bad_option_is_one_line_naming_the_key(plugrl_recipe, options, message):
    with pytest.raises(RecipeError) as info:
        plugrl_recipe({"rollout.agent": {"env": "word_guess", "env_args": options}})
    assert str(info.value) == message


def test_explain_describes_the_options(plugrl_plugin_manager):
    info = explain("rollout.agent.env_args.max_guesses", plugrl_plugin_manager)
    assert (info.type, info.default) == ("int", 6)
    assert info.help.startswith("Guesses before the word is revealed")


def test_rows_repeat_for_a_seed():
    assert make_rows(4, seed=1) == make_rows(4, seed=1)
    assert {row["data_source"] for row in make_rows(4)} == {"word_guess"}
