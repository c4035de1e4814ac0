"""``tool``: the model answers, calling the run's tools between its turns.

Token in, token out: the model's tokens stay exactly as the engine sampled them; between two
turns the loop appends only the tokens the chat template adds for the tool results and the
next generation prompt (the rendered conversation with the results, less the rendered
conversation without them), with ``loss_mask`` 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.api import RecipeError
from plugrl.api.agents import AgentLoop, Message, Session, ToolCall, Trajectory


def render(tokenizer: Any, messages: Sequence[Message], tools: list[dict] | None, *, gen: bool):
    """``messages`` through the tokenizer's chat template, as text."""
    return tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=gen, tokenize=False
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of rendered text (the template wrote its special tokens itself)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def appended_ids(
    tokenizer: Any,
    messages: Sequence[Message],
    new: Sequence[Message],
    tools: list[dict] | None,
    *,
    ended_on_eos: bool = False,
) -> list[int]:
    """The tokens the chat template adds after ``messages`` for the ``new`` messages and the
    next generation prompt. ``ended_on_eos``: the model's turn ended with the eos token, so
    what the template writes after it to close the turn (ChatML's newline after
    ``<|im_end|>``) was not sampled and is appended too."""
    before = render(tokenizer, messages, tools, gen=False)
    after = render(tokenizer, [*messages, *new], tools, gen=True)
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders the conversation so far differently once tool results "
            "follow it, so the tokens to append cannot be told apart; use a template that "
            "renders earlier turns the same whatever follows"
        )
    glue = ""
    eos = getattr(tokenizer, "eos_token", None)
    if ended_on_eos and eos and eos in before:
        glue = before[before.rindex(eos) + len(eos) :]
    return encode(tokenizer, glue + after[len(before) :])


def call_message(call: ToolCall) -> dict[str, Any]:
    """A call as an assistant message's ``tool_calls`` entry."""
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": call.arguments if call.arguments is not None else call.raw,
        },
    }


class ToolLoop(AgentLoop):
    """Generate; when the turn calls tools, run them and append their results; repeat until a
    turn calls none (``stop``), ``rollout.agent.max_turns`` turns were taken (``max_turns``)
    or the response budget (``data.max_response_length``, appended tokens included) is spent
    (``length``). The prompt is the row's chat messages (``prompt``) rendered with the run's
    tool schemas (the decoded ``raw_prompt_ids`` as one user message when the row has none).
    A reward a tool gives is its turn's reward."""

    async def run(self, row: Mapping[str, Any], session: Session) -> Trajectory:
        tokenizer = session.tokenizer
        tools = session.tool_schemas() or None
        messages: list[Message] = [dict(m) for m in (row.get("prompt") or [])]
        if not messages:
            text = tokenizer.decode(list(row["raw_prompt_ids"]), skip_special_tokens=True)
            messages = [{"role": "user", "content": text}]
        prompt_ids = encode(tokenizer, render(tokenizer, messages, tools, gen=True))
        limit = self.context.recipe.data.max_prompt_length
        if len(prompt_ids) > limit:
            # the engines are sized for prompts of this length at most
            raise RecipeError(
                f"a prompt rendered with the tools' schemas is {len(prompt_ids)} tokens, over "
                f"data.max_prompt_length={limit}; raise data.max_prompt_length by what the "
                "schemas add",
                key="data.max_prompt_length",
            )
        out = Trajectory(prompt_ids=prompt_ids)
        budget = session.max_response_length
        rewards: list[float | None] = []
        finish = "max_turns"
        for turn in range(session.config.max_turns):
            completion = await session.generate(
                [*prompt_ids, *out.response_ids], budget - len(out.response_ids)
            )
            tokens = list(completion.token_ids)
            out.response_ids += tokens
            out.loss_mask += [1] * len(tokens)
            out.log_probs += list(completion.log_probs)
            out.token_versions += list(completion.token_versions)
            out.weight_version = completion.weight_version
            out.num_turns = turn + 1
            if tokens:
                out.turn_ends.append(len(out.response_ids) - 1)
                rewards.append(None)
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            parsed = session.parse_tool_calls(text)
            message: Message = {"role": "assistant", "content": parsed.content}
            if parsed.tool_calls:
                message["tool_calls"] = [call_message(c) for c in parsed.tool_calls]
            messages.append(message)
            if completion.finish_reason == "aborted":
                finish = "aborted"
                break
            if completion.finish_reason == "length" or len(out.response_ids) >= budget:
                finish = "length"
                break
            if not parsed.tool_calls:
                finish = "stop"
                break
            if turn + 1 == session.config.max_turns:
                break  # the last turn's calls are not run: nothing would read their results
            results = await session.call_tools(parsed.tool_calls, row)
            if rewards and session.last_tool_reward is not None:
                rewards[-1] = session.last_tool_reward
            answers = [
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": result if isinstance(result, str) else json.dumps(result),
                }
                for call, result in zip(parsed.tool_calls, results, strict=False)
            ]
            ended_on_eos = bool(tokens) and tokens[-1] == tokenizer.eos_token_id
            appended = appended_ids(tokenizer, messages, answers, tools, ended_on_eos=ended_on_eos)
            messages += answers
            room = budget - len(out.response_ids)
            kept = appended[:room]
            version = out.token_versions[-1] if out.token_versions else out.weight_version
            out.response_ids += kept
            out.loss_mask += [0] * len(kept)
            out.log_probs += [0.0] * len(kept)
            out.token_versions += [version] * len(kept)
            if len(appended) >= room:
                finish = "length"  # no room left for the model to answer the results
                break
        out.finish_reason = finish
        out.messages = messages
        if any(r is not None for r in rewards):
            out.turn_rewards = [r or 0.0 for r in rewards]
        return out
