"""DAPO's maths reward (data sources ``math_dapo``, ``math``, ``aime*``): the ``Answer:`` line.

The response's last ``Answer: X`` (anywhere in a line, any case, ASCII or full-width colon)
within its final ``TAIL_CHARS`` characters is the prediction. Prediction and ground truth are
normalised the way the Minerva paper (Lewkowycz et al., 2022, appendix D) describes, which is
what DAPO's recipe uses: keep what follows the last ``=``, drop units and filler words, unwrap
``\\text{}``, ``\\boxed{}``, ``$...$``, complete ``\\frac12`` and ``\\sqrt2``, and drop thousands
commas. Then the two strings must be equal. Score +1.0 correct, -1.0 otherwise (no answer
included), so that DAPO's group statistics see a symmetric reward.
"""

from __future__ import annotations

import re
from typing import Any

from plugrl_plugins.rewards.scorers.extract import last_answer_line

# The answer is looked for at the end of the response only, as DAPO does.
TAIL_CHARS = 300

# Replacements, in order (the first ones remove articles so "a 5" reads "5").
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# Units, filler words and spacing commands deleted outright.
_DROP = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "ft",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_INLINE_MATH = re.compile(r"^.*?\$(.*?)\$.*$", re.DOTALL)
_UNWRAP = (
    re.compile(r"\\text\{(.*?)\}"),
    re.compile(r"\\textbf\{(.*?)\}"),
    re.compile(r"\\overline\{(.*?)\}"),
)
_BOXED = re.compile(r"\\boxed\{(.*)\}")
_SHORT_FRAC = re.compile(r"frac([^{])(.)")
_SHORT_SQRT = re.compile(r"sqrt([^{])")


def normalize_answer(answer: str) -> str:
    """Minerva-style normalisation of a final answer (see the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for unwanted in _DROP:
        text = text.replace(unwanted, "")
    text = _INLINE_MATH.sub(r"$\1$", text)
    for pattern in _UNWRAP:
        text = pattern.sub(r"\1", text)
    text = _BOXED.sub(r"\1", text)
    text = _SHORT_FRAC.sub(r"frac{\1}{\2}", text)
    text = _SHORT_SQRT.sub(r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """+1.0 when the normalised ``Answer:`` equals the normalised ground truth, else -1.0."""
    raw = last_answer_line(solution_str[-TAIL_CHARS:])
    pred = normalize_answer(raw) if raw is not None else None
    correct = pred is not None and pred != "" and pred == normalize_answer(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
