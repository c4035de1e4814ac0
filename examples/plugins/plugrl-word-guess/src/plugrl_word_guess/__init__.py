"""plugrl-word-guess: the ``word_guess`` environment, played by plugrl's ``env`` agent loop.

The model guesses a hidden word; after each wrong guess it is told, letter by letter, which
letters are in place, which are in the word elsewhere, and which are not in it.
"""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_environments(register):
    register(
        "word_guess",
        "plugrl_word_guess.env:WordGuessEnvironment",
        config="plugrl_word_guess.options:WordGuessOptions",
        description="guess a hidden word from letter-by-letter hints (multi-turn)",
    )
