"""DAPO's maths reward (data sources ``math_dapo``, ``math``, ``aime*``), scored as verl 0.9.1
scores it (``verl.utils.reward_score.math_dapo``), so reward curves compare one to one.

Only the response's final ``TAIL_CHARS`` characters are read. In that tail:

1. **The ``Answer:`` line.** The last match of ``answer`` (any case), optional whitespace, an
   ASCII ``:``, optional whitespace, then the rest of a line. The whitespace after the colon
   may include line breaks, so ``Answer:\\n42`` reads ``42``. The label may stand anywhere,
   even inside a word (``Final Answer: 7``), and matches do not overlap, so
   ``Answer: Answer: 5`` reads ``Answer: 5``. A full-width colon ``：`` is not a label.
   Prediction and ground truth are normalised (:func:`normalize_answer`) and compared as
   strings.
2. **The ``\\boxed{}`` fallback**, only when there is no ``Answer:`` line: the content of the
   last ``\\boxed{...}`` (braces matched) among the tail's last ``BOX_TAIL_CHARS`` characters,
   compared with the ground truth as it is, without normalising either.
3. Neither: the prediction is ``"[INVALID]"``.

Score +1.0 when correct, -1.0 otherwise (no answer included), so that DAPO's group statistics
see a symmetric reward. The result also carries ``acc`` (bool) and ``pred`` (the normalised
``Answer:`` text, the raw box content, or ``"[INVALID]"``), as verl's does.

``strict_box_verify=True`` (verl's option of that name) skips the ``Answer:`` line: only the box
counts, and ``pred`` is ``None`` when there is none.

Where plugrl differs: a ground truth that is not a string is compared as its text (verl fails
on it).
"""

from __future__ import annotations

import re
from typing import Any

TAIL_CHARS = 300
"""Characters at the end of the response that are searched (verl: MATH-500's longest answer
is 159 characters)."""
BOX_TAIL_CHARS = 100
"""Characters at the end of that tail searched for a ``\\boxed{}`` answer."""
NO_ANSWER = "[INVALID]"
"""The prediction when the response has neither an ``Answer:`` line nor a box."""

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOX_OPEN = "\\boxed{"

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
# Units, filler words and spacing commands deleted outright, in this order. Plain substring
# deletion: "squares" loses "square", and "5 ft" keeps its "ft" (not in the list).
_DROP = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
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
# Within one line: the first $...$ pair is kept (as $...$) and the rest of the line dropped.
_INLINE_MATH = re.compile(r"[^\n]*?\$([^\n]*?)\$[^\n]*")
# Unwrapped to their (first, shortest) argument.
_UNWRAP = (
    re.compile(r"\\text\{([^\n]*?)\}"),
    re.compile(r"\\textbf\{([^\n]*?)\}"),
    re.compile(r"\\overline\{([^\n]*?)\}"),
)
# \boxed{...} up to the line's last closing brace.
_BOXED = re.compile(r"\\boxed\{([^\n]*)\}")
# Shorthand TeX: \frac12 -> \frac{1}{2}, \sqrt3 -> \sqrt{3}.
_SHORT_FRAC = re.compile(r"frac([^{])([^\n])")
_SHORT_SQRT = re.compile(r"sqrt([^{])")


def normalize_answer(answer: str) -> str:
    """The normalised form of a final answer (after Minerva, Lewkowycz et al. 2022, app. D).

    Keep the text after the last ``=``; apply the replacements and deletions above; reduce
    inline maths to its first ``$...$``; unwrap ``\\text``, ``\\textbf``, ``\\overline`` and
    ``\\boxed``; complete ``\\frac12`` and ``\\sqrt3``; drop ``$``; drop commas when only
    digits (``str.isdigit``) remain; strip surrounding whitespace.
    """
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


def last_box_content(text: str) -> str | None:
    """What the last ``\\boxed{`` of ``text`` encloses (braces matched), or ``None`` when there
    is none or it is not closed. Only ``\\boxed{`` counts (not ``\\boxed 5`` or ``\\fbox``)."""
    start = text.rfind(_BOX_OPEN)
    if start < 0:
        return None
    body = start + len(_BOX_OPEN)
    depth = 1
    for position in range(body, len(text)):
        char = text[position]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[body:position]
    return None


def _box_verdict(tail: str, truth: str) -> tuple[bool, str | None]:
    content = last_box_content(tail[-BOX_TAIL_CHARS:])
    return content is not None and content == truth, content


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    strict_box_verify: bool = False,
) -> dict[str, Any]:
    """+1.0 when the response's answer matches the ground truth, else -1.0 (module docstring)."""
    tail = solution_str[-TAIL_CHARS:]
    truth = str(ground_truth)
    if strict_box_verify:
        correct, box_pred = _box_verdict(tail, truth)
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": box_pred}
    labelled = _ANSWER_LINE.findall(tail)
    pred = normalize_answer(labelled[-1]) if labelled else NO_ANSWER
    correct = pred == normalize_answer(truth)
    if pred == NO_ANSWER:
        # no usable Answer: line (also when its text normalises to the placeholder)
        box_correct, box_pred = _box_verdict(tail, truth)
        if box_pred is not None:
            correct, pred = box_correct, box_pred
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
