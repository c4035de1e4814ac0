"""Reading a final answer from a response: the last line that opens with ``Answer:``.

:func:`parse_answer` is the one reading of an ``Answer:`` line, used by the quickstart's warm
start and by the reward scorers that read answer lines alike, so an accuracy measured before
reinforcement learning and one after it are measured the same way. Exactly:

1. Lines are scanned for one that starts (after spaces) with ``Answer:`` in any case, ASCII or
   full-width colon. The **last** such line is the answer; text elsewhere is ignored, and an
   invalid last answer is not rescued by a valid earlier one.
2. Its value is the rest of the line with surrounding spaces and one trailing period removed.
3. The value must be one integer: optional sign (``+``, ``-``, ``−``), digits, optionally
   grouped in threes by commas (``1,234``). Decimals (``3.0``), fractions, words and several
   numbers are rejected.
"""

from __future__ import annotations

import re
from numbers import Integral
from typing import Any

ANSWER_LABEL = re.compile(r"answer\s*[:：]", re.IGNORECASE)
"""``Answer:`` in any case, with an ASCII or a full-width colon (Chinese-language models write
``Answer：``); the reward scorers that read answer lines use it too."""
_INTEGER = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")


def parse_integer(text: str) -> int | None:
    """``"1,234."`` -> 1234; ``None`` for anything that is not one integer.

    Accepted: optional sign (``+``, ``-`` or the Unicode minus ``−``), digits, thousands
    separated by commas in groups of three, surrounding spaces and one trailing period.
    Rejected: decimals (``3.5``, ``3.0``), fractions, words, several numbers, empty text.
    """
    value = text.strip().replace("−", "-")
    if value.endswith("."):
        value = value[:-1].rstrip()
    if not _INTEGER.fullmatch(value):
        return None
    return int(value.replace(",", ""))


def parse_answer(response: str) -> int | None:
    """The integer of the response's last line that opens with ``Answer:``, or ``None``
    (rules in the module docstring)."""
    value = None
    for line in response.splitlines():
        match = ANSWER_LABEL.match(line.lstrip())
        if match:
            value = line.lstrip()[match.end() :]
    return None if value is None else parse_integer(value)


def ground_truth_value(ground_truth: Any) -> int:
    """The ground truth as an integer (an integer, or its text as :func:`parse_integer` reads
    it); a ``ValueError`` otherwise."""
    truth = ground_truth if isinstance(ground_truth, Integral) else parse_integer(str(ground_truth))
    if truth is None or isinstance(truth, bool):
        raise ValueError(f"ground truth {ground_truth!r} is not an integer")
    return int(truth)
