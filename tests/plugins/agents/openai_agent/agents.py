"""Agents as users write them, for the ``openai`` loop's tests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from tests.plugins.agents.openai_agent.endpoint_support import ADD_TOOL

SEEN: list[dict[str, Any]] = []
"""What :func:`takes_everything` was called with."""

NOT_A_FUNCTION = 42


async def solve(row: dict[str, Any], client: openai.AsyncOpenAI) -> float:
    """Ask, run the tool calls the model makes, ask again; 1.0 when the answer is right."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(
        model="plugrl", messages=messages, tools=[ADD_TOOL]
    )
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        result = str(arguments["a"] + arguments["b"])
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = await client.chat.completions.create(
        model="plugrl", messages=messages, tools=[ADD_TOOL]
    )
    answer = final.choices[0].message.content or ""
    return float(answer.endswith(row["reward_model"]["ground_truth"]))


async def two_questions(row: dict[str, Any], *, base_url: str, api_key: str, model: str) -> None:
    """Two conversations that do not continue each other, with a client of its own."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model=model, messages=row["prompt"])
        other = [{"role": "user", "content": "Now something else."}]
        await client.chat.completions.create(model=model, messages=other)


def blocking(data: dict[str, Any], client: openai.OpenAI, greeting: str = "Hello") -> bool:
    """A plain function with a blocking client."""
    messages = [{"role": "user", "content": f"{greeting}! {data['prompt'][0]['content']}"}]
    answer = client.chat.completions.create(model="plugrl", messages=messages)
    return answer.choices[0].message.content == "3"


async def takes_everything(row: dict[str, Any], **kwargs: Any) -> None:
    SEEN.append(kwargs)
    await kwargs["client"].chat.completions.create(model="plugrl", messages=row["prompt"])


async def raises(row: dict[str, Any], client: openai.AsyncOpenAI) -> float:
    await client.chat.completions.create(model="plugrl", messages=row["prompt"])
    raise ValueError("no answer found")


async def returns_text(row: dict[str, Any], client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model="plugrl", messages=row["prompt"])
    return "good"


async def sleeps(row: dict[str, Any], client: openai.AsyncOpenAI) -> None:
    await client.chat.completions.create(model="plugrl", messages=row["prompt"])
    await asyncio.sleep(60)


async def silent(row: dict[str, Any], client: openai.AsyncOpenAI) -> float:
    return 1.0


async def no_model(row: dict[str, Any]) -> float:
    return 1.0


async def no_row(*, client: openai.AsyncOpenAI) -> None:
    return None


async def needs_more(row: dict[str, Any], client: openai.AsyncOpenAI, rubric: str) -> None:
    return None


async def chatty(row: dict[str, Any], client: openai.AsyncOpenAI) -> float:
    """Three turns of one conversation, each answer sent back as the client got it."""
    messages = list(row["prompt"])
    for _ in range(3):
        answer = await client.chat.completions.create(model="plugrl", messages=messages)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        messages.append({"role": "user", "content": "Go on."})
    return 0.0


class Solver:
    """An agent object whose ``__call__`` is async, with state of its own."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    async def __call__(self, row: dict[str, Any], client: openai.AsyncOpenAI) -> float:
        row["prompt"].append({"role": "user", "content": self.suffix})
        await client.chat.completions.create(model="plugrl", messages=row["prompt"])
        return 1.0


solver = Solver("Be brief.")


async def raises_per_sample(
    row: dict[str, Any], client: openai.AsyncOpenAI, sample_id: str
) -> None:
    await client.chat.completions.create(model="plugrl", messages=row["prompt"])
    raise ValueError(f"sample {sample_id} went wrong")
