"""The quickstart task: two-digit addition with a worked, column-by-column answer.

A prompt asks ``What is 47 + 38?``; a response works the columns and ends with the line
``Answer: 85``. The ground truth is the sum as a string, and :func:`score` checks the last
``Answer:`` line, so a response is right or wrong whatever the steps before it say.

A response is read by :func:`plugrl.rewards.answers.parse_answer` (its rules are in that
module), for the warm start's accuracy and the ``plugrl/arithmetic`` reward alike, so the
accuracy before reinforcement learning and the one after it are measured the same way.

The warm-start examples are imperfect on purpose: in most examples whose units column
carries, the carry is forgotten (``7 + 8 = 15`` instead of ``7 + 8 = 15, carry 1``) and the
answer is wrong. A model trained on them writes the format well, samples the carry now and
then, and greedily forgets it. Reinforcement learning has a clear thing to learn: carry.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugrl.rewards.answers import ground_truth_value, parse_answer

DATA_SOURCE = "plugrl/arithmetic"
ABILITY = "arithmetic"


@attrs.frozen
class Problem:
    """``left + right`` with both operands in 10..99."""

    left: int
    right: int

    @property
    def answer(self) -> int:
        return self.left + self.right

    @property
    def carries(self) -> bool:
        """Whether the units column carries into the tens."""
        return self.left % 10 + self.right % 10 >= 10

    @property
    def question(self) -> str:
        return f"What is {self.left} + {self.right}?"


def worked_answer(problem: Problem, *, forget_carry: bool = False) -> str:
    """The response that works the columns; ``forget_carry`` drops the units carry (the one
    mistake the warm-start data teaches)."""
    left_tens, left_units = divmod(problem.left, 10)
    right_tens, right_units = divmod(problem.right, 10)
    units_sum = left_units + right_units
    carry = 1 if units_sum >= 10 and not forget_carry else 0
    units_line = f"{left_units} + {right_units} = {units_sum}"
    if carry:
        units_line += ", carry 1"
    tens_sum = left_tens + right_tens + carry
    tens_line = f"{left_tens} + {right_tens}" + (" + 1" if carry else "") + f" = {tens_sum}"
    answer = tens_sum * 10 + units_sum % 10
    return f"{units_line}\n{tens_line}\nAnswer: {answer}"


def score(response: str, ground_truth: Any) -> float:
    """1.0 when :func:`parse_answer` reads the ground truth's integer, else 0.0."""
    return 1.0 if parse_answer(response) == ground_truth_value(ground_truth) else 0.0


def _all_problems() -> tuple[list[Problem], list[Problem]]:
    pairs = [Problem(a, b) for a in range(10, 100) for b in range(10, 100)]
    return [p for p in pairs if p.carries], [p for p in pairs if not p.carries]


@attrs.frozen
class TaskSplits:
    """Disjoint problem sets: ``warm_start`` (supervised examples), ``train`` (RL prompts),
    ``val`` (held out)."""

    warm_start: list[Problem]
    train: list[Problem]
    val: list[Problem]


def make_splits(
    seed: int,
    *,
    num_warm_start: int,
    num_train: int,
    num_val: int,
    carry_fraction: float,
) -> TaskSplits:
    """Draw disjoint problems; ``carry_fraction`` of each split carries in the units column
    (the problems where the warm-started model is usually wrong)."""
    rng = random.Random(seed)
    carrying, plain = _all_problems()
    rng.shuffle(carrying)
    rng.shuffle(plain)
    carrying_iter: Iterator[Problem] = iter(carrying)
    plain_iter: Iterator[Problem] = iter(plain)

    def draw(count: int) -> list[Problem]:
        num_carrying = round(count * carry_fraction)
        chosen = [next(carrying_iter) for _ in range(num_carrying)]
        chosen += [next(plain_iter) for _ in range(count - num_carrying)]
        rng.shuffle(chosen)
        return chosen

    try:
        return TaskSplits(val=draw(num_val), warm_start=draw(num_warm_start), train=draw(num_train))
    except StopIteration:
        raise ValueError(
            f"not enough distinct two-digit problems for {num_val} + {num_warm_start} + "
            f"{num_train} at carry_fraction {carry_fraction}"
        ) from None


def warm_start_examples(
    problems: Sequence[Problem], seed: int, *, forget_carry_probability: float
) -> list[tuple[str, str]]:
    """(question, response) pairs; a carrying problem's response forgets the carry with the
    given probability."""
    rng = random.Random(seed)
    examples = []
    for problem in problems:
        forget = problem.carries and rng.random() < forget_carry_probability
        examples.append((problem.question, worked_answer(problem, forget_carry=forget)))
    return examples


def verl_row(
    question: str, answer: int, *, split: str, index: int, ability: str = ABILITY, **extra: Any
) -> dict[str, Any]:
    """One row in verl's parquet schema, scored by the ``plugrl/arithmetic`` scorer; ``extra``
    goes into its ``extra_info`` beside the split and the index."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, **extra},
    }


def verl_rows(problems: Sequence[Problem], split: str) -> list[dict[str, Any]]:
    """Rows in verl's parquet schema."""
    return [
        verl_row(
            problem.question, problem.answer, split=split, index=index, carries=problem.carries
        )
        for index, problem in enumerate(problems)
    ]


def write_rows(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """``rows`` as a parquet file at ``path`` (its folder made if missing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def write_parquet(problems: Sequence[Problem], split: str, path: Path) -> Path:
    return write_rows(verl_rows(problems, split), path)
