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
    ToolResult,
    Trajectory,
    text_between_turns,
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


def image_arguments(trajectory: Trajectory) -> dict[str, Any]:
    """The keyword arguments of ``Session.generate`` that carry the trajectory's image inputs;
    none for a text sample, so that a session written before images still serves it."""
    return {"image_inputs": list(trajectory.image_inputs)} if trajectory.image_inputs else {}


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
    A reward a tool gives is its turn's reward.

    With a vision-language model the prompt keeps the row's images, and a tool result's images
    (``ToolResult.images``) are appended with it, each expanded to its tokens, their image
    inputs kept in ``Trajectory.image_inputs``; a result whose image tokens do not fit what is
    left of the budget ends the trajectory (``length``) before it, never cut through an
    image."""

    async def run(self, row: Mapping[str, Any], session: Session) -> Trajectory:
        tokenizer = session.tokenizer
        tools = session.tool_schemas() or None
        messages: list[Message] = [dict(m) for m in (row.get("prompt") or [])]
        if not messages:
            text = tokenizer.decode(list(row["raw_prompt_ids"]), skip_special_tokens=True)
            messages = [{"role": "user", "content": text}]
        images = session.images
        prompt_inputs = None
        if images is not None:
            rendered = render(tokenizer, images.prompt_messages(messages, row), tools, gen=True)
            prompt_ids, prompt_inputs = images.prompt(rendered, row)
        else:
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
        if prompt_inputs is not None:
            out.image_inputs.append(prompt_inputs)
        budget = session.max_response_length
        rewards: list[float | None] = []
        finish = "max_turns"
        for turn in range(session.config.max_turns):
            completion = await session.generate(
                [*prompt_ids, *out.response_ids],
                budget - len(out.response_ids),
                **image_arguments(out),
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
            messages += answers
            room = budget - len(out.response_ids)
            if any(result.images for result in results):
                appended, inputs = self._with_images(session, answers, results, tokens, tools)
                if len(appended) >= room:
                    finish = "length"  # no room for the images and the model's answer
                    break
                out.add_appended(appended, inputs)
                continue
            appended = tokens_between_turns(tokenizer, answers, last_token_ids=tokens, tools=tools)
            out.add_appended(appended[:room])
            if len(appended) >= room:
                finish = "length"  # no room left for the model to answer the results
                break
        out.finish_reason = finish
        out.messages = messages
        if any(r is not None for r in rewards):
            out.turn_rewards = [r or 0.0 for r in rewards]
        return out

    def _with_images(
        self,
        session: Session,
        answers: list[Message],
        results: list[ToolResult],
        last_tokens: list[int],
        tools: list[dict] | None,
    ) -> tuple[list[int], dict[str, Any] | None]:
        """The tokens between turns with the results' images in them (each result's images at
        its ``<image>`` places, else before its text), and their image inputs. Images that
        could never fit the response budget stop the run in one line."""
        images = session.images
        assert images is not None  # the session's tool caller refused images otherwise
        placed = [
            {**answer, "content": images.place(r.text, len(r.images), what="tool result")}
            for answer, r in zip(answers, results, strict=True)
        ]
        text = text_between_turns(
            session.tokenizer, placed, last_token_ids=last_tokens, tools=tools
        )
        every_image = [image for r in results for image in r.images]
        appended, inputs = images.encode(text, every_image, what="tool results")
        image_tokens = images.image_tokens(appended)
        budget = session.max_response_length
        if image_tokens >= budget:
            raise RecipeError(
                f"sample {session.sample_id}: the {len(every_image)} images of a turn's tool "
                f"results are {image_tokens} tokens, more than data.max_response_length="
                f"{budget} holds; raise it or return smaller images",
                key="data.max_response_length",
            )
        return appended, inputs
