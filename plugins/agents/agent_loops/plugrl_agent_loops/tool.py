"""``tool``: the model answers, calling the run's tools between its turns.

Token in, token out: the model's tokens stay exactly as the engine sampled them; between two
turns the loop appends only the tokens the chat template writes there (the close of the model's
turn, the tool results, the next generation prompt:
:func:`plugrl.agents.turns.tokens_between_turns`), with ``loss_mask`` 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.api import RecipeError
from plugrl.api.agents import (
    AgentLoop,
    Message,
    Session,
    ToolCall,
    Trajectory,
    tokens_between_turns,
)


def render(tokenizer: Any, messages: Sequence[Message], tools: list[dict] | None, *, gen: bool):
    """``messages`` through the tokenizer's chat template, as text."""
    return tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=gen, tokenize=False
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of rendered text (the template wrote its special tokens itself)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


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
            out.add_turn(completion)
            if tokens:
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
                    "content": result.text,
                }
                for call, result in zip(parsed.tool_calls, results, strict=True)
            ]
            appended = tokens_between_turns(tokenizer, answers, last_token_ids=tokens, tools=tools)
            messages += answers
            room = budget - len(out.response_ids)
            out.add_appended(appended[:room])
            if len(appended) >= room:
                finish = "length"  # no room left for the model to answer the results
                break
        out.finish_reason = finish
        out.messages = messages
        if any(r is not None for r in rewards):
            out.turn_rewards = [r or 0.0 for r in rewards]
        return out
