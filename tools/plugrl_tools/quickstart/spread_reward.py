"""A scoring function for end-to-end runs of an untrained model.

An untrained model never answers an arithmetic prompt right, so the built-in scorer gives
every response 0: every advantage is 0 and nothing trains. This one gives each response a
score drawn from a hash of its text, so responses of one prompt score differently and two runs
have the same scores only when they sampled the same text. ``acc`` is still the arithmetic
task's own verdict. ``binary=True`` rounds the score to 0 or 1, so that about half of the
groups of two responses score the same (the groups dynamic sampling drops).
"""

import hashlib

from plugrl_tools.quickstart.arithmetic import score as arithmetic_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, binary=False):
    digest = hashlib.sha256(solution_str.encode("utf-8")).digest()
    value = int.from_bytes(digest[:8], "big") / 2**64
    if binary:
        value = float(value >= 0.5)
    return {"score": value, "acc": arithmetic_score(solution_str, ground_truth)}
