"""The ``word_guess`` environment and rows to play it from."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from plugrl.api.agents import Environment, Message, StepResult
from plugrl_word_guess.options import WordGuessOptions

WORDS = (
    "apple", "brave", "chair", "dance", "eagle", "flame", "grape", "house", "input", "juice",
    "knife", "lemon", "music", "night", "ocean", "piano", "queen", "river", "stone", "tiger",
)  # fmt: skip
"""The words of :func:`make_rows`."""

_GUESS = re.compile(r"<guess>\s*([A-Za-z]+)\s*</guess>")


def hint(guess: str, word: str) -> str:
    """Each letter of ``guess``: upper case when in its place, lower case when in ``word``
    elsewhere, ``_`` when not in it: ``hint("dream", "grape") == "_ R e a _"``. Letters are
    counted: a letter guessed twice but in the word once is marked once."""
    marks = ["_"] * len(guess)
    left: dict[str, int] = {}
    for g, w in zip(guess, word, strict=True):
        if g != w:
            left[w] = left.get(w, 0) + 1
    for i, (g, w) in enumerate(zip(guess, word, strict=True)):
        if g == w:
            marks[i] = g.upper()
        elif left.get(g, 0) > 0:
            marks[i] = g.lower()
            left[g] -= 1
    return " ".join(marks)


def read_guess(message: str) -> str | None:
    """The last ``<guess>word</guess>`` of a model turn, lower case; ``None`` if there is
    none."""
    found = _GUESS.findall(message)
    return found[-1].lower() if found else None


class WordGuessEnvironment(Environment):
    """One game: the word is the row's ``extra_info.word``. A turn must end with
    ``<guess>word</guess>``; a guess of the wrong length, or no guess, is answered with the
    rules and counts as a guess. Metrics of the last step: ``solved`` (1 or 0) and
    ``guesses``."""

    config: WordGuessOptions

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        word = str(row["extra_info"]["word"]).lower()
        if not word.isalpha():
            raise ValueError(f"extra_info.word must be letters only, got {word!r}")
        self.word = word
        self.guesses = 0
        return [
            {
                "role": "user",
                "content": (
                    f"I am thinking of a {len(word)}-letter word. Guess it: end each answer "
                    f"with <guess>word</guess>. After a wrong guess I show each letter in "
                    f"upper case if it is in its place, in lower case if it is elsewhere in "
                    f"the word, and _ if it is not in the word."
                ),
            }
        ]

    async def step(self, message: str) -> StepResult:
        self.guesses += 1
        guess = read_guess(message)
        out_of_guesses = self.guesses >= self.config.max_guesses > 0
        if guess == self.word:
            return StepResult(
                observation="",
                reward=self.config.solve_reward,
                done=True,
                metrics={"solved": 1.0, "guesses": float(self.guesses)},
            )
        reward = 0.0
        if guess is None or len(guess) != len(self.word):
            text = f"End your answer with <guess>word</guess>, a {len(self.word)}-letter word."
        else:
            in_place = sum(g == w for g, w in zip(guess, self.word, strict=True))
            reward = self.config.letter_reward * in_place / len(self.word)
            text = hint(guess, self.word)
        if out_of_guesses:
            return StepResult(
                observation=f"The word was {self.word}.",
                reward=reward,
                done=True,
                metrics={"solved": 0.0, "guesses": float(self.guesses)},
            )
        return StepResult(observation=text, reward=reward)


def make_rows(count: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` rows of words drawn from :data:`WORDS` with ``seed``, each with the
    ``extra_info.word`` the environment reads and ``data_source`` ``word_guess``."""
    rng = random.Random(seed)
    return [
        {"data_source": "word_guess", "extra_info": {"word": rng.choice(WORDS)}}
        for _ in range(count)
    ]
