"""Competition maths with a boxed final answer (``lighteval/MATH``, ``HuggingFaceH4/MATH-500``).

The prediction is the content of the response's last ``\\boxed{...}``. It is correct when,
after LaTeX normalisation (:func:`normalize_latex`), it equals the ground truth as text, or
when ``math-verify`` finds the two mathematically equal (``0.5`` and ``\\frac{1}{2}``,
``2\\sqrt{2}`` and ``\\sqrt{8}``, ``x=3`` and ``3``). ``math-verify`` parses LaTeX into SymPy
expressions; it never executes the text. Score 1.0 correct, else 0.0.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from plugrl_scorers.extract import last_boxed

# Seconds math-verify may spend parsing or comparing one answer. Its own timer is a SIGALRM,
# which only works in a process's main thread; elsewhere the reward manager's timeout (a
# worker process it can kill) is what bounds a pathological expression.
VERIFY_TIMEOUT_S = 5

_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_UNITS_AFTER = re.compile(r"\\text\{\s[^{}]*\}$")
_SHORT_SQRT = re.compile(r"\\sqrt(\w)")
_SHORT_FRAC = re.compile(r"\\frac(?:(\d)|\{([^{}]*)\})(?:(\d)|\{([^{}]*)\})")
_SLASH_FRACTION = re.compile(r"^(-?\d+)/(\d+)$")
_SHORT_VARIABLE = re.compile(r"^[a-zA-Z]\w?(?:_\w+)?=")


def normalize_latex(answer: str) -> str:
    """A canonical text form of a LaTeX answer, for string comparison.

    Removes: line breaks, spacing commands (``\\!``, ``\\,``, ``\\;``, ``\\quad``),
    ``\\left``/``\\right``, ``\\displaystyle``, dollar signs, degree marks, percent signs,
    a trailing unit in ``\\text{ ...}``, a trailing period and all spaces; unwraps
    ``\\text{}``-like wrappers; reads ``\\dfrac``/``\\tfrac`` as ``\\frac``; completes
    ``\\frac12`` and ``\\sqrt3``; writes ``a/b`` of integers and ``0.5`` as fractions; drops a
    short ``x =`` in front; adds the 0 of ``.5``.
    """
    text = answer.strip().replace("\n", "")
    text = _UNITS_AFTER.sub("", text)
    for unwanted in ("\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad", "\\displaystyle"):
        text = text.replace(unwanted, "")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for degree in ("^{\\circ}", "^\\circ", "°"):
        text = text.replace(degree, "")
    text = text.replace("\\$", "").replace("$", "")
    text = text.replace("\\%", "").replace("%", "")
    previous = None
    while previous != text:  # nested wrappers
        previous, text = text, _TEXT_WRAPPER.sub(r"\1", text)
    text = text.replace(" ", "").rstrip(".")
    if _SHORT_VARIABLE.match(text) and text.count("=") == 1:
        text = text.split("=", 1)[1]
    text = _SHORT_SQRT.sub(r"\\sqrt{\1}", text)
    text = _SHORT_FRAC.sub(
        lambda m: f"\\frac{{{m.group(1) or m.group(2)}}}{{{m.group(3) or m.group(4)}}}", text
    )
    if text.startswith("."):
        text = "0" + text
    text = text.replace("{.", "{0.")
    if text == "0.5":
        text = "\\frac{1}{2}"
    slash = _SLASH_FRACTION.match(text)
    if slash:
        text = f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}"
    return text


def equivalent(prediction: str, truth: str) -> bool:
    """Equal after normalisation, or mathematically equal according to math-verify."""
    if normalize_latex(prediction) == normalize_latex(truth):
        return True
    return _math_verify_equal(prediction, truth)


def _math_verify_equal(prediction: str, truth: str) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    in_main_thread = threading.current_thread() is threading.main_thread()
    timeout = VERIFY_TIMEOUT_S if in_main_thread else None
    config = [LatexExtractionConfig()]
    try:
        gold = parse(f"\\boxed{{{truth}}}", extraction_config=config, parsing_timeout=timeout)
        pred = parse(f"\\boxed{{{prediction}}}", extraction_config=config, parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:
        # math-verify raises on expressions it cannot handle; text that it cannot read as
        # maths is simply not equal to the truth (the string comparison already failed).
        return False


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """1.0 when the last boxed answer is equivalent to the ground truth, else 0.0."""
    truth = str(ground_truth)
    boxed_truth = last_boxed(truth)
    if boxed_truth is not None:
        truth = boxed_truth
    pred = last_boxed(solution_str)
    correct = pred is not None and pred.strip() != "" and equivalent(pred, truth)
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": pred}
