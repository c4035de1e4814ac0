"""The built-in score parsers of LLM judges: every form each reads, and answers without one."""

from __future__ import annotations

import pytest

from plugrl_judge.parsers import boxed, number, rating, yes_no


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is right.\nRating: [[7]]", 7.0),
        ("Rating: [[ 7.5 ]]", 7.5),
        ("[[3]] at first, but on reflection Rating: [[8]]", 8.0),
        ("Score: 6", 6.0),
        ("rating = 4", 4.0),
        ("SCORE:[9]", 9.0),
        ("Rating: [[2]] and Score: 9", 2.0),  # the double brackets win over a label
        ("Rating: [[-1]]", -1.0),
    ],
)
def test_rating_reads_double_brackets_then_a_labelled_number(text, expected):
    assert rating(text) == expected


@pytest.mark.parametrize(
    "text",
    ["A fine answer.", "Rating: [[seven]]", "I give it 7", "", "Rating: [[]]"],
)
def test_rating_finds_nothing_without_its_form(text):
    assert rating(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", 7.0),
        ("I would say 3, no, 4.5", 4.5),
        ("a loss of -2", -2.0),
        ("worth .25 points", 0.25),
        ("The score is 7 out of 10", 10.0),  # the last number, whatever it means
    ],
)
def test_number_reads_the_last_number(text, expected):
    assert number(text) == expected


def test_number_finds_nothing_in_text_without_digits():
    assert number("seven out of ten") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes.", 1.0),
        ("no, because the sum is wrong", 0.0),
        ("YES", 1.0),
        ("The verdict: no. Though yes, it tried.", 0.0),  # the first of the two words
    ],
)
def test_yes_no_reads_the_first_yes_or_no(text, expected):
    assert yes_no(text) == expected


@pytest.mark.parametrize("text", ["maybe", "yesterday nobody came", ""])
def test_yes_no_needs_the_whole_word(text):
    assert yes_no(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{7}", 7.0),
        (r"first \boxed{2}, finally \boxed{ 9 }", 9.0),
        (r"\boxed{3/4}", 0.75),
        (r"\boxed{\frac{1}{2}}", 0.5),
        (r"\boxed{\dfrac{3}{4}}", 0.75),
    ],
)
def test_boxed_reads_the_number_in_the_last_box(text, expected):
    assert boxed(text) == expected


@pytest.mark.parametrize(
    "text", [r"no box, 7", r"\boxed{x+1}", r"\boxed{7", r"\boxed{1/0}", r"\boxed{}"]
)
def test_boxed_finds_nothing_but_a_closed_box_holding_a_number(text):
    assert boxed(text) is None


@pytest.mark.parametrize("parse", [rating, number, boxed])
def test_numbers_too_large_for_a_float_count_as_no_score(parse):
    huge = "9" * 400
    assert parse(f"Rating: [[{huge}]] \\boxed{{{huge}}}") is None


def test_the_parsers_are_registered_by_name(plugrl_plugin_manager):
    registry = plugrl_plugin_manager.registry("judge_parsers")
    assert registry.names() == ["boxed", "number", "rating", "yes_no"]
    assert registry.load("rating")("Rating: [[5]]") == 5.0
