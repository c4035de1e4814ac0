"""Pulling the final answer out of a model's text: ``\\boxed{...}``, ``Answer: ...`` lines.

Nothing here evaluates model output; answers are only matched and compared as text (or, for
LaTeX maths, parsed by a math-verification library that builds expressions, never runs code).
"""

from __future__ import annotations

from plugrl.api.rewards import ANSWER_LABEL

BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``).

    Braces are matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. An unclosed box
    gives ``None``: a response cut off inside its answer has no answer.
    """
    start = max(text.rfind(command) for command in BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if not rest.lstrip().startswith("{"):
        if not rest.startswith(" "):
            return None  # "\boxedx" is another command
        # "\boxed 5": the argument is the next space-free token
        token = rest.split(maxsplit=1)
        return token[0].rstrip("$.") if token else None
    rest = rest.lstrip()
    depth = 0
    for position, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:position]
    return None


def last_answer_line(text: str) -> str | None:
    """The text after the last ``Answer:`` label, up to the end of its line, stripped.

    The label (:data:`plugrl.api.rewards.ANSWER_LABEL`) matches in any case, with an
    ASCII or a full-width colon, anywhere in a line (``The final answer: 5``), the last one of
    the line counting.
    """
    found = None
    for line in text.splitlines():
        matches = list(ANSWER_LABEL.finditer(line))
        if matches:
            found = line[matches[-1].end() :]
    return found.strip() if found is not None else None
