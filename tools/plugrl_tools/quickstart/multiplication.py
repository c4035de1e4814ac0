"""The tool quickstart's task: three-digit multiplication, which the tiny model cannot do in its
head but can do with the ``calculator`` tool.

A prompt asks ``What is 347 * 812?``. The model answers in two turns: a call

    <tool_call>{"name":"calculator","arguments":{"expression":"347*812"}}</tool_call>

then, after the tool's result comes back in a ``<tool_response>``, the line ``Answer: 281764``.
The reward is the quickstart's: 1 for a correct last ``Answer:`` line
(:func:`plugrl_tools.quickstart.arithmetic.score`, the ``plugrl/arithmetic`` scorer), 0
otherwise; a call earns nothing by itself.

The chat format is Qwen2.5's (hermes) made compact for a 4M-parameter model:
:data:`CHAT_TEMPLATE` lists the tools in a one-line system turn (``Tools: calculator(expression)``)
instead of their JSON schemas, writes each call as compact JSON between ``<tool_call>`` tags,
and sends tool results back in a user turn, each between ``<tool_response>`` tags. The four
tags are tokens of their own (:data:`TOOL_TOKENS`), added to the byte-level BPE as Qwen's are:
not special, so decoding keeps them and the ``hermes`` parser reads the calls.

The warm-start conversations are imperfect on purpose, in two ways reinforcement learning can
fix. On "hard" problems (the first number 500 or more) most examples answer at once with a
near-miss guess instead of calling the tool; and some calls are malformed (the argument named
``expr``, or ``x`` for ``*``), get an error back, and are followed by a guess. A model trained on
them calls the tool on small first numbers, guesses on large ones, and now and then writes a bad
call: the run's metrics show tool calls rising and tool errors falling as it learns.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugrl_tools.quickstart import arithmetic
from plugrl_tools.quickstart.arithmetic import DATA_SOURCE, score

__all__ = ["DATA_SOURCE", "score"]

ABILITY = "tool_use"
TOOL_NAME = "calculator"
HARD_FROM = 500
"""Problems whose first number is at least this are "hard": the warm start mostly guesses."""

TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Tags added to the tokenizer as single tokens (not special: decoding keeps them)."""

# Qwen2.5's ChatML with tools, compact: a one-line tool list, compact JSON calls, and
# consecutive tool results gathered in one user turn. An assistant message's ``tool_calls``
# follow its content; a call's arguments may be a dict or a JSON string (OpenAI's form). An
# assistant turn ends at <|im_end|>, the eos token, with no newline after it: the model stops
# there, so the tokens it samples and the rendered conversation agree token for token.
# (transformers renders with trim_blocks: a newline right after a block tag is dropped.)
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:"
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    " {{ f.name }}({{ f.parameters.properties | join(',') }})"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user\n"
    "{% endif %}"
    "<tool_response>{{ message.content }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set call = call.function if call.function is defined else call %}"
    '<tool_call>{"name":"{{ call.name }}","arguments":'
    "{% if call.arguments is string %}{{ call.arguments }}"
    "{% else %}{{ call.arguments | tojson(separators=(',', ':')) }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "{% if message.role == 'assistant' %}<|im_end|>{% else %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ERROR_PREFIX = "Error: "
"""How a failed call's message reaches the model in the warm start's conversations."""


@attrs.frozen
class Problem:
    """``left * right`` with both operands in 100..999."""

    left: int
    right: int

    @property
    def answer(self) -> int:
        return self.left * self.right

    @property
    def hard(self) -> bool:
        """Whether the warm start mostly guesses on it (first number 500 or more)."""
        return self.left >= HARD_FROM

    @property
    def question(self) -> str:
        return f"What is {self.left} * {self.right}?"

    @property
    def expression(self) -> str:
        return f"{self.left}*{self.right}"


@attrs.frozen
class TaskSplits:
    """Disjoint problem sets: ``warm_start`` (supervised conversations), ``train`` (RL
    prompts), ``val`` (held out)."""

    warm_start: list[Problem]
    train: list[Problem]
    val: list[Problem]


def make_splits(
    seed: int, *, num_warm_start: int, num_train: int, num_val: int, hard_fraction: float
) -> TaskSplits:
    """Draw disjoint problems; ``hard_fraction`` of each split is hard (see :attr:`Problem.hard`).

    There are 900 x 900 problems, so the splits are drawn rather than enumerated."""
    rng = random.Random(seed)
    seen: set[Problem] = set()

    def fresh(hard: bool) -> Problem:
        while True:
            low, high = (HARD_FROM, 999) if hard else (100, HARD_FROM - 1)
            problem = Problem(rng.randint(low, high), rng.randint(100, 999))
            if problem not in seen:
                seen.add(problem)
                return problem

    def draw(count: int) -> list[Problem]:
        num_hard = round(count * hard_fraction)
        chosen = [fresh(True) for _ in range(num_hard)]
        chosen += [fresh(False) for _ in range(count - num_hard)]
        rng.shuffle(chosen)
        return chosen

    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction must be between 0 and 1, got {hard_fraction}")
    return TaskSplits(val=draw(num_val), warm_start=draw(num_warm_start), train=draw(num_train))


def call_message(arguments: dict[str, Any], name: str = TOOL_NAME) -> dict[str, Any]:
    """An assistant message that calls ``name`` with ``arguments`` (OpenAI's message form)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def guess(problem: Problem, rng: random.Random) -> int:
    """A near miss: the product off by a few hundred or thousand, never right."""
    offset = 0
    while offset == 0:
        offset = rng.randint(-3000, 3000)
    return max(1, problem.answer + offset)


ToolRunner = Callable[[dict[str, Any]], str]
"""Runs one call's arguments through the calculator and returns the text the model sees
(an :data:`ERROR_PREFIX` message, as a run words it, for a refused call)."""


def warm_start_conversations(
    problems: Sequence[Problem],
    seed: int,
    run_tool: ToolRunner,
    *,
    guess_probability: float,
    bad_call_probability: float,
) -> list[list[dict[str, Any]]]:
    """One conversation per problem, as chat messages: the user's question, then either a
    guess (a hard problem, with ``guess_probability``) or a call, the tool's answer and the
    final answer; a call is malformed with ``bad_call_probability`` and followed by a guess."""
    rng = random.Random(seed)
    conversations = []
    for problem in problems:
        messages: list[dict[str, Any]] = [{"role": "user", "content": problem.question}]
        if problem.hard and rng.random() < guess_probability:
            messages.append({"role": "assistant", "content": f"Answer: {guess(problem, rng)}"})
            conversations.append(messages)
            continue
        arguments: dict[str, Any] = {"expression": problem.expression}
        bad = rng.random() < bad_call_probability
        if bad:
            arguments = (
                {"expr": problem.expression}
                if rng.random() < 0.5
                else {"expression": f"{problem.left}x{problem.right}"}
            )
        result = run_tool(arguments)
        final = guess(problem, rng) if bad else problem.answer
        messages += [
            call_message(arguments),
            {"role": "tool", "name": TOOL_NAME, "content": result},
            {"role": "assistant", "content": f"Answer: {final}"},
        ]
        conversations.append(messages)
    return conversations


def verl_rows(problems: Sequence[Problem], split: str) -> list[dict[str, Any]]:
    """Rows in verl's parquet schema, scored by the ``plugrl/arithmetic`` scorer."""
    return [
        arithmetic.verl_row(
            problem.question,
            problem.answer,
            split=split,
            index=index,
            ability=ABILITY,
            hard=problem.hard,
        )
        for index, problem in enumerate(problems)
    ]


def write_parquet(problems: Sequence[Problem], split: str, path: Path) -> Path:
    return arithmetic.write_rows(verl_rows(problems, split), path)


def plain_text(messages: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The words of a conversation without the tags, for training the BPE (the tags are
    whole tokens of their own)."""
    for message in messages:
        if message.get("content"):
            yield message["content"]
        for call in message.get("tool_calls") or []:
            function = call["function"]
            yield json.dumps(
                {"name": function["name"], "arguments": function["arguments"]},
                separators=(",", ":"),
            )
