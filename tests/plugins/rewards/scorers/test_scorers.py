"""Each built-in scorer on a table of model outputs that look like real ones."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl.rewards.answers import parse_integer
from plugrl_scorers import arithmetic, gsm8k, math_boxed, math_dapo
from plugrl_scorers import multiple_choice as mc
from plugrl_scorers.extract import last_boxed

# ------------------------------------------------------------------------------ arithmetic

ARITHMETIC = [
    # (response, ground truth, score, pred)
    ("17 + 25 = 42.\nAnswer: 42", "42", 1.0, "42"),
    ("Answer: 41", "42", 0.0, "41"),
    ("17 + 25 = 42", "42", 0.0, None),  # no Answer line
    ("Answer: 40\nWait, I made a mistake.\nAnswer: 42", "42", 1.0, "42"),  # last wins
    ("Answer: 42\nHmm, no.\nAnswer: 43", "42", 0.0, "43"),
    ("Answer: 42\nAnswer: forty-two", "42", 0.0, None),  # invalid last line is not rescued
    ("Answer:    1,234.  ", "1234", 1.0, "1234"),  # spaces, comma, trailing period
    ("answer: 7", "7", 1.0, "7"),  # any case
    ("  Answer : -15", "-15", 1.0, "-15"),
    ("Answer: −3", "-3", 1.0, "-3"),  # Unicode minus
    ("Answer: +8", "8", 1.0, "8"),
    ("Answer: 3.0", "3", 0.0, None),  # a decimal is not an integer
    ("Answer: 3.5", "3", 0.0, None),
    ("Answer: 7/2", "3", 0.0, None),
    ("Answer: 12,34", "1234", 0.0, None),  # not a thousands grouping
    ("Answer: 42 apples", "42", 0.0, None),
    ("Answer:", "42", 0.0, None),
    ("The final Answer: 42", "42", 0.0, None),  # the label must open its line
    ("我们先计算 17 + 25。\nAnswer：42", "42", 1.0, "42"),  # Chinese text, full-width colon
    ("先算乘法，再算加法。\nAnswer: 56\n", 56, 1.0, "56"),  # integer ground truth
    ("Answer: 9", np.int64(9), 1.0, "9"),  # ground truth read from parquet
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), ARITHMETIC)
def test_arithmetic(response, truth, score, pred):
    result = arithmetic.compute_score("plugrl/arithmetic", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


TRICKY = [
    "Answer: 42\nmore text after the answer",
    "answer: 42",
    "  ANSWER : 42",
    "Answer：42",
    "Answer: 1,234.",
    "Answer: +42",
    "Answer: −42",
    "Answer: 42.0",
    "Answer: 4 2",
    "Answer: 42\nAnswer: forty-two",
    "The final Answer: 42",
    "Answer:\n42",
    "",
]


@pytest.mark.parametrize("response", TRICKY)
@pytest.mark.parametrize("truth", ["42", "1234", "-42"])
def test_the_reward_and_the_quickstart_accuracy_read_an_answer_alike(response, truth):
    from plugrl_tools.quickstart.arithmetic import parse_answer, score

    result = arithmetic.compute_score("plugrl/arithmetic", response, truth)
    assert result["score"] == score(response, truth)
    pred = parse_answer(response)
    assert result["pred"] == (None if pred is None else str(pred))


def test_arithmetic_rejects_a_ground_truth_that_is_not_an_integer():
    with pytest.raises(ValueError, match=r"ground truth '4\.5' is not an integer"):
        arithmetic.compute_score("plugrl/arithmetic", "Answer: 4", "4.5")


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), (" 1,000,000. ", 1000000), ("-0", 0), ("1.", 1), ("", None), ("1e3", None)],
)
def test_parse_integer(text, value):
    assert parse_integer(text) == value


# ------------------------------------------------------------------------------ gsm8k
# Exact agreement with verl is checked on a frozen table in test_verl_parity.py; these are
# the behaviours a reader of docs/rewards.md relies on.

GSM8K_STRICT = [
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", "72", 1.0, "72"),
    ("48 + 24 = 72\n#### 71", "72", 0.0, "71"),
    ("She sold 72 clips altogether.", "72", 0.0, None),  # strict needs ####
    ("#### 70\nLet me recheck.\n#### 72", "72", 1.0, "72"),  # last one
    ("#### 1,250", "1250", 1.0, "1250"),  # commas removed
    ("#### $1,250", "1250", 0.0, None),  # no dollar sign after ####
    ("####72", "72", 0.0, None),  # exactly one space after ####
    ("#### 72.00", "72", 0.0, "72.00"),  # compared as strings
    ("#### 72.", "72", 0.0, "72."),
    ("#### -5", "-5", 1.0, "-5"),
    ("她一共卖出了 72 个发夹。\n#### 72", "72", 1.0, "72"),
    ("#### seventy-two", "72", 0.0, None),
    ("#### 72" + " ok" * 100, "72", 0.0, None),  # beyond the last 300 characters
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), GSM8K_STRICT)
def test_gsm8k_strict(response, truth, score, pred):
    result = gsm8k.compute_score("openai/gsm8k", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


GSM8K_FLEXIBLE = [
    ("She sold 72 clips altogether.", "72", 1.0, "72"),
    ("First 48, then 24, so 72 in total", "72", 1.0, "72"),
    ("First 48, then 24, so 70 in total.", "72", 0.0, "70"),
    ("So 72.", "72", 0.0, "72."),  # the period belongs to the number
    ("No idea", "72", 0.0, None),
    ("No idea.", "72", 0.0, "."),  # a lone period, when nothing else is found
    ("答案是 1,234。", "1234", 0.0, "1,234"),  # commas kept
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), GSM8K_FLEXIBLE)
def test_gsm8k_flexible(response, truth, score, pred):
    result = gsm8k.compute_score_flexible("openai/gsm8k", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


GSM8K_LENIENT = [
    # (response, ground truth, method, score, pred)
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", "72", "strict", 1.0, "72"),
    ("48 + 24 = 72\n#### 71", "72", "strict", 0.0, "71"),
    ("She sold 72 clips altogether.", "72", "strict", 0.0, None),
    ("#### 70\nLet me recheck.\n#### 72", "72", "strict", 1.0, "72"),
    ("The total cost is $1,250.\n#### $1,250", "1250", "strict", 1.0, "1250"),
    ("####72", "72", "strict", 1.0, "72"),
    ("#### 72.00", "72", "strict", 1.0, "72"),  # compared by value
    ("#### 72.", 72, "strict", 1.0, "72"),
    ("#### −5", "-5", "strict", 1.0, "-5"),
    ("#### seventy-two", "72", "strict", 0.0, None),
    ("#### 72" + " ok" * 100, "72", "strict", 1.0, "72"),  # a 1000-character tail
    ("She sold 72 clips altogether.", "72", "flexible", 1.0, "72"),
    ("First 48, then 24, so 70 in total.", "72", "flexible", 0.0, "70"),
    ("答案是 1,234。", "1234", "flexible", 1.0, "1234"),
    ("No idea.", "72", "flexible", 0.0, None),
]


@pytest.mark.parametrize(("response", "truth", "method", "score", "pred"), GSM8K_LENIENT)
def test_gsm8k_lenient(response, truth, method, score, pred):
    result = gsm8k.compute_score("openai/gsm8k", response, truth, method=method, lenient=True)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


def test_gsm8k_lenient_function_is_the_lenient_strict_parse():
    assert gsm8k.compute_score_lenient("openai/gsm8k", "#### $72.0", "72")["score"] == 1.0
    with pytest.raises(ValueError, match="ground truth 'many' is not a number"):
        gsm8k.compute_score_lenient("openai/gsm8k", "#### 3", "many")


def test_gsm8k_format_score_and_bad_method():
    assert gsm8k.compute_score("openai/gsm8k", "#### 3", "4", format_score=0.1)["score"] == 0.1
    # no answer at all scores 0, whatever the format score (verl's rule) ...
    assert gsm8k.compute_score("openai/gsm8k", "three", "4", format_score=0.1)["score"] == 0.0
    # ... but the lenient parse keeps plugrl's earlier rule
    lenient = gsm8k.compute_score("openai/gsm8k", "three", "4", format_score=0.1, lenient=True)
    assert lenient["score"] == 0.1
    for forgiving in (False, True):
        with pytest.raises(ValueError, match="unknown gsm8k method 'loose'"):
            gsm8k.compute_score("openai/gsm8k", "#### 3", "4", method="loose", lenient=forgiving)


def test_gsm8k_reads_a_ground_truth_that_is_not_a_string_as_its_text():
    assert gsm8k.compute_score("openai/gsm8k", "#### 72", np.int64(72))["score"] == 1.0
    assert gsm8k.compute_score("openai/gsm8k", "#### 72", 72.0)["score"] == 0.0  # "72.0"


# ------------------------------------------------------------------------------ DAPO maths

DAPO = [
    ("Adding up the cases gives 204.\nAnswer: 204", "204", 1.0, "204"),
    ("So the count is 205.\nAnswer: 205", "204", -1.0, "205"),
    ("The answer is 204.", "204", -1.0, "[INVALID]"),  # no Answer: line, no box
    ("The answer is \\boxed{204}.", "204", 1.0, "204"),  # the box fallback
    ("\\boxed{204}\nAnswer: 205", "204", -1.0, "205"),  # the Answer line comes first
    ("Answer: 12\nActually, recounting...\nAnswer: 204", "204", 1.0, "204"),
    ("Answer:\n204", "204", 1.0, "204"),  # the answer on the next line
    ("Answer: $\\frac{3}{4}$", "\\frac{3}{4}", 1.0, "\\frac{3}{4}"),
    ("Answer: \\frac34", "\\frac{3}{4}", 1.0, "\\frac{3}{4}"),  # completed \frac
    ("Answer: \\dfrac{3}{4}", "\\frac{3}{4}", -1.0, "\\dfrac{3}{4}"),  # DAPO keeps \dfrac
    ("Answer: x = 5", "5", 1.0, "5"),  # after the last =
    ("Answer: 30 degrees", "30", 1.0, "30"),  # units dropped
    ("Answer: 1,000", "1000", 1.0, "1000"),
    ("Answer: \\boxed{17}", "17", 1.0, "17"),
    ("Answer: 2\\sqrt3", "2\\sqrt{3}", 1.0, "2\\sqrt{3}"),
    ("首先考虑所有情况，共有 204 种。\nAnswer：204", "204", -1.0, "[INVALID]"),  # full-width colon
    ("ANSWER: 204", "204", 1.0, "204"),
    ("Answer: 204" + " and then more" * 40, "204", -1.0, "[INVALID]"),  # beyond the last 300
    ("Answer: 204", 204, 1.0, "204"),  # a ground truth that is not a string
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), DAPO)
def test_math_dapo(response, truth, score, pred):
    result = math_dapo.compute_score("math_dapo", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


def test_math_dapo_strict_box_verify_reads_only_the_box():
    result = math_dapo.compute_score("math_dapo", "Answer: 5", "5", strict_box_verify=True)
    assert result == {"score": -1.0, "acc": False, "pred": None}
    boxed = math_dapo.compute_score("aime2024", "\\boxed{5}", "5", strict_box_verify=True)
    assert boxed == {"score": 1.0, "acc": True, "pred": "5"}


# ------------------------------------------------------------------------------ boxed MATH

BOXED = [
    ("The probability is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
    ("So the answer is $\\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}", 1.0),
    ("Thus $\\boxed{\\frac12}$.", "\\frac{1}{2}", 1.0),
    ("Thus $\\boxed{0.5}$.", "\\frac{1}{2}", 1.0),
    ("We get $\\boxed{2\\sqrt{2}}$", "\\sqrt{8}", 1.0),  # only math-verify sees this
    ("We get $\\boxed{x = 3}$", "3", 1.0),
    ("The angle is $\\boxed{30^\\circ}$", "30", 1.0),
    ("The cost is $\\boxed{\\$18.90}$", "18.90", 1.0),
    ("The point is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "(3,\\frac{\\pi}{2})", 1.0),
    ("The answer is $\\boxed{10\\text{ inches}}$", "10", 1.0),
    ("Answer: \\boxed{5} ... no wait, \\boxed{6}", "6", 1.0),  # the last box
    ("Answer: \\boxed{6} ... no wait, \\boxed{5}", "6", 0.0),
    ("We get $\\boxed{\\frac{1}{3}}$", "\\frac{1}{2}", 0.0),
    ("The answer is 1/2.", "\\frac{1}{2}", 0.0),  # no box
    ("The answer is $\\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),  # cut off inside the box
    ("所以答案是 $\\boxed{7}$。", "7", 1.0),
    ("\\boxed{}", "0", 0.0),
    ("\\fbox{12}", "12", 1.0),
    ("so it is \\boxed 4$.", "4", 1.0),
]


@pytest.mark.parametrize(("response", "truth", "score"), BOXED)
def test_math_boxed(response, truth, score):
    result = math_boxed.compute_score("lighteval/MATH", response, truth)
    assert result["score"] == score
    assert result["acc"] is (score == 1.0)


def test_math_boxed_reads_a_boxed_ground_truth():
    truth = "So $x = \\boxed{\\frac{2}{3}}$."
    assert math_boxed.compute_score("lighteval/MATH", "\\boxed{2/3}", truth)["score"] == 1.0


@pytest.mark.parametrize(
    ("latex", "normal"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{10}", "\\frac{1}{10}"),
        ("3/4", "\\frac{3}{4}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("\\left(1, 2\\right)", "(1,2)"),
        ("x = 5", "5"),
        ("50\\%", "50"),
        (".25", "0.25"),
        ("\\text{Monday}", "Monday"),
        ("12 \\text{ cm}", "12"),
        ("\\!10,\\!000", "10,000"),
    ],
)
def test_normalize_latex(latex, normal):
    assert math_boxed.normalize_latex(latex) == normal


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("a \\boxed{1} b \\boxed{{2}}", "{2}"),
        ("\\boxed {3}", "3"),
        ("\\boxed{unclosed", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


# ------------------------------------------------------------------------------ multiple choice

CHOICES = [
    ("The capital of France is Paris, so \\boxed{B}", "B", 1.0, "B"),
    ("\\boxed{(C)}", "C", 1.0, "C"),
    ("\\boxed{\\text{D}}", "D", 1.0, "D"),
    ("\\boxed{B. Paris}", "B", 1.0, "B"),
    ("\\boxed{A}", "B", 0.0, "A"),
    ("I think A, no, \\boxed{A} ... final: \\boxed{C}", "C", 1.0, "C"),
    ("Answer: (B)", "B", 1.0, "B"),  # no box: the Answer line
    ("The answer is B.", "B", 0.0, None),
    ("\\boxed{Paris}", "B", 0.0, None),
    ("所以正确选项是 \\boxed{C}", 2, 1.0, "C"),  # 0-based index ground truth
    ("\\boxed{J}", "j", 1.0, "J"),  # MMLU-Pro has ten options
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), CHOICES)
def test_multiple_choice(response, truth, score, pred):
    result = mc.compute_score("multiple_choice", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


def test_multiple_choice_rejects_a_bad_ground_truth():
    with pytest.raises(ValueError, match="ground truth 'Paris' is not an option letter"):
        mc.compute_score("multiple_choice", "\\boxed{A}", "Paris")
