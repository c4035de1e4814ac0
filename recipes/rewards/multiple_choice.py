"""Reward for multiple-choice questions with one or several correct letters.

The letters (A-G) in the response's last ``\\boxed{...}`` must be exactly the ground truth's
letters, in any order: "\\boxed{B, D}" matches "BD"; missing or extra letters score 0.
verl's signature, so the file also works as verl's custom_reward_function.
"""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
LETTER = re.compile(r"(?<![A-Za-z])[A-G](?![A-Za-z])")
ONLY_LETTERS = re.compile(r"[A-G\s,;/&]+")


def choice_letters(text: str) -> str:
    """The distinct choice letters of ``text``, sorted: "BD", "D, B" and "D and B" -> "BD".

    Text made only of letters A-G and separators counts every letter; otherwise only letters
    standing alone do (the "A" of "Answer" is no choice)."""
    text = text.strip()
    if ONLY_LETTERS.fullmatch(text):
        return "".join(sorted(set(re.findall(r"[A-G]", text))))
    return "".join(sorted(set(LETTER.findall(text))))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    boxes = BOXED.findall(solution_str)
    if not boxes:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    predicted = choice_letters(boxes[-1])
    correct = bool(predicted) and predicted == choice_letters(str(ground_truth))
    return {"score": 1.0 if correct else 0.0, "acc": 1.0 if correct else 0.0, "pred": predicted}
