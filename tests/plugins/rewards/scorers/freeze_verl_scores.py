"""Freeze verl's scores of tricky responses into ``data/verl_scores.json``, which
``test_verl_parity.py`` reads to check that plugrl's ``math_dapo`` and ``gsm8k`` scorers score
exactly as verl does.

Not a test and not run in CI: verl is not a dependency of plugrl. Rerun it by hand after
changing the tables below, against verl 0.9.1 installed without its dependencies (its reward
score modules need only the standard library; importing the ``verl`` package needs a few
small packages)::

    pip install --no-deps --target /tmp/verl-0.9.1 verl==0.9.1 codetiming hydra-core \\
        omegaconf antlr4-python3-runtime==4.9.3 dill pylatexenc tensordict pyvers \\
        cloudpickle orjson
    PYTHONPATH=/tmp/verl-0.9.1 python tests/plugins/rewards/freeze_verl_scores.py

Recorded per case: verl's ``compute_score`` result. For ``math_dapo`` that is the whole dict
(``score``, ``acc``, ``pred``). For ``gsm8k``, whose ``compute_score`` returns the score alone,
``pred`` is verl's ``extract_solution`` with the same method and ``acc`` is whether that
answer equals the ground truth, which is the test verl's score rests on.
"""

from __future__ import annotations

import json
from pathlib import Path

OUTPUT = Path(__file__).parent / "data" / "verl_scores.json"
VERL_VERSION = "0.9.1"

FILLER = "We check each case carefully and keep going. "  # 45 characters


def pad_to(text: str, length: int) -> str:
    """``text`` preceded by filler so the whole is exactly ``length`` characters."""
    body = (FILLER * (length // len(FILLER) + 1))[: length - len(text)]
    return body + text


# (response, ground truth[, keyword arguments]) ------------------------------------ math_dapo
MATH_DAPO: list[tuple] = [
    # the Answer: line
    ("Adding up the cases gives 204.\nAnswer: 204", "204"),
    ("So the count is 205.\nAnswer: 205", "204"),
    ("answer: 7", "7"),
    ("ANSWER : 7", "7"),
    ("Answer:7", "7"),
    ("Answer:\t7", "7"),
    ("Answer:\n42", "42"),  # newline after the colon
    ("Answer:\n\n   42\n", "42"),
    ("Answer: \n", "42"),  # a space, then nothing
    ("Answer:", "42"),
    ("Answer:\n", "42"),
    ("Answer: \n\\boxed{4}", "4"),  # the label reaches the next line
    ("Answer：42", "42"),  # full-width colon
    ("我们先计算所有情况。\nAnswer：204\n\\boxed{204}", "204"),
    ("Answer:\u300042", "42"),  # ideographic space after the colon
    ("The Final Answer: 7", "7"),
    ("The answer is 7.", "7"),
    ("Answer: 3\nLet me recheck.\nAnswer: 4", "4"),
    ("Answer: 3\nLet me recheck.\nAnswer: 4", "3"),
    ("Answer: Answer: 5", "5"),
    ("Answer: 42\r\n", "42"),
    ("Answer: 5\nThat is all.", "5"),
    ("Answer: [INVALID]\n\\boxed{7}", "7"),
    # normalisation
    ("Answer: x = 5", "5"),
    ("Answer: x=3, y=4", "4"),
    ("Answer: $5$", "5"),
    ("Answer: $1$ and $2$", "1"),
    ("Answer: \\boxed{5}", "5"),
    ("Answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
    ("Answer: \\frac12", "\\frac{1}{2}"),
    ("Answer: \\frac{1}{2}", "\\frac12"),
    ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}"),
    ("Answer: \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("Answer: \\sqrt2", "\\sqrt{2}"),
    ("Answer: 2\\sqrt{3}", "2\\sqrt3"),
    ("Answer: 0.5", "\\frac{1}{2}"),
    ("Answer: 1,000", "1000"),
    ("Answer: 1,000,000", "1000000"),
    ("Answer: 1,2", "12"),
    ("Answer: 1{,}000", "1000"),
    ("Answer: -1,000", "-1000"),
    ("Answer: -5", "-5"),
    ("Answer: −5", "-5"),  # Unicode minus
    ("Answer: \\$1,000.50", "1000.50"),
    ("Answer: 5 dollars", "5"),
    ("Answer: \\$5", "5"),
    ("Answer: 10 feet", "10"),
    ("Answer: 10 ft", "10"),
    ("Answer: 3 \\text{ units}", "3"),
    ("Answer: 5 cm", "5"),
    ("Answer: 12 students", "12"),
    ("Answer: 4 squares", "4"),
    ("Answer: 90^\\circ", "90"),
    ("Answer: 90^{\\circ}", "90"),
    ("Answer: 100\\%", "100"),
    ("Answer: 5.", "5"),
    ("Answer: $5.$", "5"),
    ("Answer: a 5", "5"),
    ("Answer: an apple", "apple"),
    ("Answer: \\text{(B)}", "(B)"),
    ("Answer: \\textbf{C}", "C"),
    ("Answer: \\mbox{A}", "A"),
    ("Answer: \\overline{AB}", "AB"),
    ("Answer: 3 \\text{and} 4", "3,4"),
    ("Answer: \\text{five}", "five"),
    ("Answer: ４２", "42"),  # full-width digits
    ("Answer: 2^{10}", "1024"),
    ("Answer: \\left( 1, 2 \\right)", "(1,2)"),
    ("Answer: \\left( 1, 2 \\right)", "\\left(1,2\\right)"),
    ("Answer: \\pi", "\\pi"),
    ("Answer: 5", "\\boxed{5}"),  # a boxed ground truth is unwrapped
    ("Answer: 5", "x = 5"),
    ("Answer: 5", "5\n"),
    ("Answer: 5", "$5$ and\n$6$"),  # a ground truth of two lines
    ("Answer: 6", "$5$ and\n$6$"),
    # the \boxed{} fallback (no Answer: line)
    ("So the result is \\boxed{5}.", "5"),
    ("So the result is \\boxed{5}.", "6"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),
    ("\\boxed{ 5 }", "5"),  # compared as it is
    ("\\boxed{\\frac12}", "\\frac{1}{2}"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{5}", "\\boxed{5}"),
    ("The answer is \\boxed 5", "5"),
    ("The answer is \\fbox{5}", "5"),
    ("The answer is \\boxed{5", "5"),  # not closed
    ("First \\boxed{3}, then \\boxed{4}", "4"),
    ("\\boxed{4}\nAnswer: 5", "4"),  # both: the Answer line wins
    ("\\boxed{4}\nAnswer: 4", "4"),
    ("\\boxed{\\text{(A)}}", "\\text{(A)}"),
    ("The answer is $\\boxed{12}$.", "12"),
    ("\\boxed{5}" + " and that settles it" * 5, "5"),  # 100 characters after the box
    ("\\boxed{5}" + " so" * 30, "5"),  # box within the last 100 characters
    ("", "5"),
    # the 300-character window
    ("Answer: 204" + " and then more" * 40, "204"),
    (pad_to("Answer: 5", 5000), "5"),
    (pad_to("Answer: 5", 300), "5"),
    ("Answer: 5" + " " * 291, "5"),  # the label starts at the window's first character
    ("Answer: 5" + " " * 292, "5"),  # ... one character before it
    ("Answer: 5" + " " * 293, "5"),
    ("Answer: 5\n" + FILLER * 7, "5"),  # 315 characters after the line
    ("Answer: 5\n" + FILLER * 6, "5"),  # 270
    (pad_to("\\boxed{5}", 150) + FILLER * 3, "5"),
    ("Answer: 1" + FILLER * 10 + "\\boxed{9}", "9"),
    # strict_box_verify: only the box counts
    ("Answer: 5\n\\boxed{5}", "5", {"strict_box_verify": True}),
    ("Answer: 5", "5", {"strict_box_verify": True}),
    ("\\boxed{6}", "5", {"strict_box_verify": True}),
    ("\\boxed{ 5}", "5", {"strict_box_verify": True}),
    ("\\boxed{5}" + " so" * 40, "5", {"strict_box_verify": True}),
]

# (response, ground truth[, keyword arguments]) ---------------------------------------- gsm8k
GSM8K_RESPONSES: list[tuple] = [
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", "72"),
    ("48 + 24 = 72\n#### 71", "72"),
    ("She sold 72 clips altogether.", "72"),
    ("####72", "72"),
    ("#### 72", "72"),
    ("####  72", "72"),
    ("####\t72", "72"),
    ("#### 72.0", "72"),
    ("#### 72.00", "72.00"),
    ("#### 72.", "72"),
    ("#### 72 clips.", "72"),
    ("#### 1,234", "1234"),
    ("#### 1,234", "1,234"),
    ("#### 5,000,000", "5000000"),
    ("#### 12,34", "1234"),
    ("#### $72", "72"),
    ("#### $1,250", "1250"),
    ("The total cost is $1,250.\n#### 1250", "1250"),
    ("#### -5", "-5"),
    ("#### −5", "-5"),  # Unicode minus
    ("#### +5", "5"),
    ("#### - 5", "-5"),
    ("#### -,5", "-5"),
    ("#### .5", ".5"),
    ("#### .5", "0.5"),
    ("#### 0072", "72"),
    ("#### 1.2.3", "1.2.3"),
    ("#### 1e3", "1000"),
    ("#### 3/4", "3/4"),
    ("#### ,", "72"),
    ("#### .", "72"),
    ("#### -", "72"),
    ("#### seventy-two", "72"),
    ("#### 70\nLet me recheck.\n#### 72", "72"),
    ("#### 72\nLet me recheck.\n#### 70", "72"),
    ("#### 72 #### 73", "73"),
    ("##### 72", "72"),
    ("######## 72", "72"),
    ("**#### 72**", "72"),
    ("＃＃＃＃ 72", "72"),
    ("#### ７２", "72"),  # full-width digits
    ("She has 72.\n####", "72"),
    ("The answer is 72.", "72"),
    ("72", "72"),
    ("", "72"),
    ("她一共卖出了 72 个发夹。\n#### 72", "72"),
    ("First 48, then 24, so 72 in total", "72"),
    ("First 48, then 24, so 70 in total.", "72"),
    ("答案是 1,234。", "1234"),
    ("No idea.", "72"),
    ("It costs $5.50 in total.", "5.50"),
    ("The change is -3 dollars.", "-3"),
    ("The answer: 72...", "72"),
    ("Just a period.", "72"),
    ("#### 72" + " and that is final" * 20, "72"),  # 360 characters after the answer
    ("#### 72" + " ok" * 90, "72"),  # 270 after
    (pad_to("#### 72", 2000), "72"),
    (pad_to("#### 72", 300), "72"),
    ("#### 72" + " " * 293, "72"),  # the marker starts at the window's first character
    ("#### 72" + " " * 294, "72"),  # ... one character before it
    ("#### 72" + " " * 296, "72"),  # only " 72" is left: flexible still reads it
    ("#### 72" + FILLER * 7, "72"),
    ("Answer: 72\n#### 72", "72"),
    # other scores
    ("#### 3", "4", {"format_score": 0.1}),
    ("no number here", "4", {"format_score": 0.1}),
    ("#### 4", "4", {"score": 2.0, "format_score": 0.5}),
]


def _load_verl():
    import verl
    from verl.utils.reward_score import gsm8k, math_dapo

    if verl.__version__ != VERL_VERSION:
        raise SystemExit(f"found verl {verl.__version__}; freeze against {VERL_VERSION}")
    return gsm8k, math_dapo


def _split(case: tuple) -> tuple[str, str, dict]:
    response, truth, *rest = case
    return response, truth, (rest[0] if rest else {})


def main() -> None:
    verl_gsm8k, verl_math_dapo = _load_verl()
    math_cases = []
    for case in MATH_DAPO:
        response, truth, kwargs = _split(case)
        result = verl_math_dapo.compute_score(response, truth, **kwargs)
        math_cases.append(
            {
                "solution_str": response,
                "ground_truth": truth,
                "kwargs": kwargs,
                "expected": {
                    "score": float(result["score"]),
                    "acc": bool(result["acc"]),
                    "pred": result["pred"],
                },
            }
        )
    gsm8k_cases = []
    for case in GSM8K_RESPONSES:
        response, truth, extra = _split(case)
        for method in ("strict", "flexible"):
            kwargs = {"method": method, **extra}
            score = verl_gsm8k.compute_score(response, truth, **kwargs)
            answer = verl_gsm8k.extract_solution(response, method=method)
            gsm8k_cases.append(
                {
                    "solution_str": response,
                    "ground_truth": truth,
                    "kwargs": kwargs,
                    "expected": {
                        "score": float(score),
                        "acc": answer is not None and answer == truth,
                        "pred": answer,
                    },
                }
            )
    frozen = {
        "verl_version": VERL_VERSION,
        "made_by": "tests/plugins/rewards/freeze_verl_scores.py",
        "math_dapo": math_cases,
        "gsm8k": gsm8k_cases,
    }
    OUTPUT.parent.mkdir(exist_ok=True)
    text = json.dumps(frozen, indent=1, ensure_ascii=False) + "\n"
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(math_cases)} math_dapo and {len(gsm8k_cases)} gsm8k cases to {OUTPUT}")


if __name__ == "__main__":
    main()
