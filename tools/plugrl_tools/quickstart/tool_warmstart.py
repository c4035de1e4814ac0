"""The tool quickstart's tokenizer, its supervised warm start on whole conversations, and the
multi-turn accuracy check: the model calls the calculator, reads its result, answers.

Conversations become tokens piece by piece, as a run makes them: the prompt, each model turn
(up to and including ``<|im_end|>``), and the text appended between turns (the tool results
and the next turn's opening: :func:`appended_text`, computed as the ``tool`` agent loop
computes it) are tokenized separately and concatenated. Only the model's turns carry loss. The
pieces join into exactly what the chat template renders for the whole conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from plugrl_tools.quickstart.arithmetic import score
from plugrl_tools.quickstart.multiplication import (
    CHAT_TEMPLATE,
    ERROR_PREFIX,
    TOOL_NAME,
    TOOL_TOKENS,
    Problem,
)
from plugrl_tools.quickstart.progress import Progress

GENERATION_BATCH_SIZE = 128
"""Conversations per ``model.generate`` call when measuring accuracy."""


def make_tool_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """The quickstart's byte-level BPE trained on ``texts``, with the four tool tags added as
    whole tokens and the tool-aware chat template."""
    from plugrl.testing import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer(texts, vocab_size=vocab_size)
    # not special, as in Qwen2.5: decoding with skip_special_tokens keeps them for the parser
    tokenizer.add_tokens(list(TOOL_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    add_generation_prompt: bool = False,
) -> str:
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def appended_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    add_generation_prompt: bool,
) -> str:
    """What the chat template adds after ``messages`` for ``new`` (and the next generation
    prompt), as the ``tool`` agent loop appends it."""
    before = render(tokenizer, messages, tools, add_generation_prompt=False)
    after = render(tokenizer, [*messages, *new], tools, add_generation_prompt=add_generation_prompt)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently as turns follow")
    return after[len(before) :]


def segments(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> list[tuple[str, bool]]:
    """A conversation (a user question, then assistant turns with tool results between them)
    as ``(text, is_model_turn)`` pieces; joined, they are the template's rendering of it."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    pieces = [(render(tokenizer, messages[:first], tools, add_generation_prompt=True), False)]
    index = first
    while index < len(messages):
        turn = render(tokenizer, messages[: index + 1], tools)
        pieces.append((turn[len("".join(t for t, _ in pieces)) :], True))
        end = index + 1
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        if end > index + 1:
            text = appended_text(
                tokenizer,
                messages[: index + 1],
                messages[index + 1 : end],
                tools,
                add_generation_prompt=True,
            )
            pieces.append((text, False))
        index = end
    return pieces


def conversation_tokens(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation and, per token, whether it is the model's (trained)."""
    ids: list[int] = []
    trained: list[bool] = []
    for text, is_model in segments(tokenizer, messages, tools):
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        trained += [is_model] * len(piece)
    return ids, trained


class Toolbox:
    """The run's calculator tool and ``hermes`` parser, found through the installed plugins,
    for the warm start's conversations and its accuracy check."""

    def __init__(self, plugins: Any = None) -> None:
        from plugrl.plugin.manager import get_plugin_manager

        plugins = plugins or get_plugin_manager()
        entry = plugins.registry("tools").get(TOOL_NAME)
        config_class = entry.load_config()
        self.tool = entry.load()(config_class(), None)
        self.parse = plugins.registry("tool_parsers").get("hermes").load()

    def schemas(self) -> list[dict[str, Any]]:
        return [self.tool.schema()]

    def run(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """The text the model sees for one call, and whether the call failed."""
        import asyncio

        from plugrl.parts.agent import ToolArgumentError, ToolContext, ToolResult

        # the texts a run's session writes for failed calls
        if name != TOOL_NAME:
            return f"{ERROR_PREFIX}unknown tool {name!r}; the tools are: {TOOL_NAME}.", True
        try:
            result = asyncio.run(self.tool.call(arguments, ToolContext(row={}, sample_id="")))
        except ToolArgumentError as exc:
            return f"{ERROR_PREFIX}bad arguments for tool {name!r}: {exc}", True
        except Exception as exc:
            return f"{ERROR_PREFIX}tool {name!r} failed: {type(exc).__name__}: {exc}", True
        return (result.text if isinstance(result, ToolResult) else str(result)), False

    def run_arguments(self, arguments: dict[str, Any]) -> str:
        """The calculator's text for ``arguments`` (what the warm-start conversations show)."""
        return self.run(TOOL_NAME, arguments)[0]


@attrs.frozen
class Rollout:
    """One multi-turn answer: the response text as the reward reads it (model turns and tool
    results), and what happened."""

    text: str
    turns: int
    tool_calls: int
    tool_errors: int


def rollouts(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    toolbox: Toolbox,
    *,
    max_turns: int = 3,
    max_new_tokens: int = 40,
    batch_size: int = GENERATION_BATCH_SIZE,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[Rollout]:
    """Answer each problem as a run would: generate a turn; when it calls tools, append their
    results and generate again, up to ``max_turns`` turns (greedy at temperature 0)."""
    import torch

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    eos_id = tokenizer.eos_token_id
    schemas = toolbox.schemas()
    out: list[Rollout] = []
    for begin in range(0, len(problems), batch_size):
        chunk = problems[begin : begin + batch_size]
        ids = [
            tokenizer(
                render(
                    tokenizer,
                    [{"role": "user", "content": p.question}],
                    schemas,
                    add_generation_prompt=True,
                ),
                add_special_tokens=False,
            )["input_ids"]
            for p in chunk
        ]
        texts = [""] * len(chunk)
        conversations: list[list[dict[str, Any]]] = [
            [{"role": "user", "content": p.question}] for p in chunk
        ]
        counts = [[0, 0, 0] for _ in chunk]  # turns, calls, errors
        active = list(range(len(chunk)))
        for turn in range(max_turns):
            if not active:
                break
            width = max(len(ids[i]) for i in active)
            input_ids = torch.full((len(active), width), tokenizer.pad_token_id)
            attention_mask = torch.zeros((len(active), width), dtype=torch.long)
            for row, i in enumerate(active):
                input_ids[row, width - len(ids[i]) :] = torch.tensor(ids[i])
                attention_mask[row, width - len(ids[i]) :] = 1
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            with torch.no_grad():
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos_id,
                    pad_token_id=tokenizer.pad_token_id,
                    **(sampling if temperature > 0 else {"do_sample": False}),
                )
            still = []
            for row, i in enumerate(active):
                new = output[row, width:].tolist()
                if eos_id in new:
                    new = new[: new.index(eos_id) + 1]
                ids[i] = ids[i] + new
                turn_text = tokenizer.decode(new, skip_special_tokens=True)
                texts[i] += turn_text
                counts[i][0] += 1
                parsed = toolbox.parse(turn_text)
                message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
                if parsed.tool_calls:
                    message["tool_calls"] = [
                        {
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": call.raw if call.arguments is None else call.arguments,
                            },
                        }
                        for call in parsed.tool_calls
                    ]
                conversations[i].append(message)
                last_turn = turn + 1 == max_turns
                if not parsed.tool_calls or not new or new[-1] != eos_id or last_turn:
                    continue
                results = []
                for call in parsed.tool_calls:
                    if call.error is not None:
                        text = f"{ERROR_PREFIX}the tool call could not be read ({call.error})."
                        failed = True
                    else:
                        text, failed = toolbox.run(call.name, call.arguments or {})
                    results.append({"role": "tool", "name": call.name, "content": text})
                    counts[i][1] += 1
                    counts[i][2] += failed
                appended = tokenizer(
                    appended_text(
                        tokenizer, conversations[i], results, schemas, add_generation_prompt=True
                    ),
                    add_special_tokens=False,
                )["input_ids"]
                conversations[i] += results
                ids[i] += appended
                texts[i] += tokenizer.decode(appended, skip_special_tokens=True)
                still.append(i)
            active = still
        out += [
            Rollout(text=text, turns=c[0], tool_calls=c[1], tool_errors=c[2])
            for text, c in zip(texts, counts, strict=True)
        ]
        if progress is not None:
            progress.update()
    return out


@attrs.frozen
class ToolEvaluation:
    """Accuracy and tool use over a set of problems (per problem averages)."""

    accuracy: float
    tool_calls: float
    tool_errors: float
    hard_accuracy: float
    easy_accuracy: float


def evaluate(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    toolbox: Toolbox,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> ToolEvaluation:
    """Fraction of problems whose final ``Answer:`` line is right, with calls and errors."""
    done = rollouts(
        model, tokenizer, problems, toolbox, temperature=temperature, seed=seed, progress=progress
    )
    right = [score(r.text, str(p.answer)) for r, p in zip(done, problems, strict=True)]

    def mean(values: Sequence[float]) -> float:
        return sum(values) / max(1, len(values))

    return ToolEvaluation(
        accuracy=mean(right),
        tool_calls=mean([r.tool_calls for r in done]),
        tool_errors=mean([r.tool_errors for r in done]),
        hard_accuracy=mean([s for s, p in zip(right, problems, strict=True) if p.hard]),
        easy_accuracy=mean([s for s, p in zip(right, problems, strict=True) if not p.hard]),
    )
