"""The cost of the OpenAI-compatible endpoint: the same multi-turn conversations made
directly (the chat template and the engine call only), through the endpoint with bare HTTP
requests (adds HTTP, JSON, the hand-off between event loops and the recording), and through
the endpoint with the ``openai`` client (adds the client's own work, which an agent pays
against any server), with an engine that answers at once, so that only that work is timed.

    python bench/bench_openai_endpoint.py [--samples 32] [--turns 4] [--repeats 3]

Needs plugrl's ``agents`` extra (``pip install -c constraints/cpu.txt -e ".[agents]"``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.parts.agent import AgentConfig, Environment, ParsedTurn, Session, ToolCall
from plugrl.parts.rollout import Completion
from plugrl.testing.tiny import make_tiny_tokenizer
from plugrl_openai_agent.endpoint import OpenAIEndpoint

ANSWER = "The answer is 42, as the question asks."


class InstantSession(Session):
    """Answers every turn at once with the same text."""

    def __init__(self, tokenizer: Any, sample_id: str, answer_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.sample_id = sample_id
        self.config = AgentConfig(max_turns=1000)
        self.max_response_length = 1_000_000
        self.answer_ids = answer_ids

    async def generate(self, token_ids: Sequence[int], max_tokens: int) -> Completion:
        ids = self.answer_ids[:max_tokens]
        return Completion(token_ids=ids, log_probs=[-0.5] * len(ids), finish_reason="stop")

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text)

    async def call_tools(self, calls: Sequence[ToolCall], row: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    def make_environment(self) -> Environment:
        raise NotImplementedError


def conversation_step(messages: list[dict[str, Any]], answer: str) -> None:
    messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": "Please go on with the next step."})


async def direct(session: InstantSession, turns: int) -> None:
    messages = [{"role": "user", "content": "What is six times seven?"}]
    for _ in range(turns):
        text = session.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        ids = session.tokenizer.encode(text, add_special_tokens=False)
        completion = await session.generate(ids, 64)
        conversation_step(messages, session.tokenizer.decode(completion.token_ids))


async def through_endpoint(
    endpoint: OpenAIEndpoint, session: InstantSession, turns: int, client_kind: str
) -> int:
    import httpx
    import openai

    sample = endpoint.open(session.sample_id, session)
    url = endpoint.sample_url(session.sample_id)
    messages = [{"role": "user", "content": "What is six times seven?"}]
    try:
        if client_kind == "openai":
            async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
                for _ in range(turns):
                    answer = await client.chat.completions.create(
                        model="plugrl", messages=messages, max_tokens=64
                    )
                    conversation_step(messages, answer.choices[0].message.content or "")
        else:
            async with httpx.AsyncClient(timeout=60) as http:
                for _ in range(turns):
                    body = {"model": "plugrl", "messages": messages, "max_tokens": 64}
                    response = await http.post(f"{url}/chat/completions", json=body)
                    conversation_step(messages, response.json()["choices"][0]["message"]["content"])
    finally:
        endpoint.release(session.sample_id)
    return len(sample.recording.trajectories())


async def timed(
    samples: int, turns: int, way: str, endpoint: OpenAIEndpoint, tokenizer: Any
) -> float:
    answer_ids = [*tokenizer.encode(ANSWER), tokenizer.eos_token_id]
    sessions = [InstantSession(tokenizer, f"s{i}/0", answer_ids) for i in range(samples)]
    start = time.perf_counter()
    if way == "direct":
        await asyncio.gather(*(direct(s, turns) for s in sessions))
    else:
        runs = (through_endpoint(endpoint, s, turns, way) for s in sessions)
        sequences = await asyncio.gather(*runs)
        assert set(sequences) == {1}, "every conversation should be one trajectory"
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="conversations at once")
    parser.add_argument("--turns", type=int, default=4, help="model calls per conversation")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (best is kept)")
    args = parser.parse_args()
    tokenizer = make_tiny_tokenizer()
    endpoint = OpenAIEndpoint()
    endpoint.start()
    ways = ("direct", "http", "openai")
    best = dict.fromkeys(ways, float("inf"))
    try:
        for way in ways[1:]:  # warm-up: imports, first connections
            asyncio.run(timed(2, 1, way, endpoint, tokenizer))
        for _ in range(args.repeats):
            for way in ways:
                seconds = asyncio.run(timed(args.samples, args.turns, way, endpoint, tokenizer))
                best[way] = min(best[way], seconds)
    finally:
        endpoint.stop()
    calls = args.samples * args.turns
    print(f"{calls} chat calls, {args.samples} conversations at once, best of {args.repeats}:")
    for way, seconds in best.items():
        extra_ms = (seconds - best["direct"]) / calls * 1000
        print(
            f"{way:>7}: {seconds:.3f} s, {calls / seconds:,.0f} calls/s, "
            f"{seconds / best['direct']:.1f}x direct, {extra_ms:+.2f} ms per call"
        )


if __name__ == "__main__":
    main()
