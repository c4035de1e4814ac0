"""A verifiers environment behind plugrl's :class:`~plugrl.parts.agent.Environment`.

verifiers runs an episode itself: ``rollout`` asks a client for each model turn, answers with
``env_response`` and stops on the environment's stop conditions; its rubric then scores the
finished episode. This adapter runs that rollout as a task whose client is a bridge: each
request the rollout makes for a model turn is answered by the text of the turn the ``env``
agent loop sampled (passed to :meth:`VerifiersEnvironment.step`), and what the rollout added
to the conversation since the model's last turn is the observation. When the rollout ends,
the rubric's score (``state["reward"]``) is the step's reward, and its metrics are reported
as the trajectory's ``env/...`` metrics.

Written against verifiers' classic environments (0.3: ``verifiers.MultiTurnEnv`` and its
subclasses, ``verifiers.Rubric``), which 0.4 moved out of the package.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import numbers
import time
import uuid
from collections.abc import Mapping
from typing import Any

import verifiers as vf
from verifiers.legacy.clients.client import Client
from verifiers.legacy.types import Response, ResponseMessage

from plugrl.api import PartContext
from plugrl.api.agents import Environment, Message, StepResult
from plugrl_verifiers_env.config import VerifiersConfig

_LOADED: dict[str, Any] = {}
"""Environments by their load target and arguments: a verifiers environment is built once
and runs many episodes (each keeps its own state)."""


def load(config: VerifiersConfig) -> Any:
    """The verifiers environment ``config`` names, built on first use."""
    key = json.dumps([config.environment, config.args], sort_keys=True, default=str)
    if key not in _LOADED:
        module_name, _, function = config.environment.partition(":")
        if function:
            try:
                loader = getattr(importlib.import_module(module_name), function)
            except (ImportError, AttributeError) as exc:
                raise ValueError(
                    f"rollout.agent.env_args.environment: cannot import {config.environment!r} "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            env = loader(**config.args)
        else:
            env = vf.load_environment(config.environment, **config.args)
        if not isinstance(env, vf.MultiTurnEnv):
            raise ValueError(
                f"rollout.agent.env_args.environment: {config.environment!r} gave a "
                f"{type(env).__name__}, not a verifiers MultiTurnEnv (SingleTurnEnv, ToolEnv, "
                f"... are ones)"
            )
        _LOADED[key] = env
    return _LOADED[key]


class _Bridge(Client):
    """A verifiers client whose model is the ``env`` agent loop: each request is handed to
    the episode, which answers it with the text the loop sampled."""

    def __init__(self, episode: VerifiersEnvironment) -> None:
        super().__init__(None)
        self.episode = episode

    def setup_client(self, config: Any) -> Any:
        return None

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
        return messages, {}

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
    ) -> str:
        return await self.episode.model_turn(prompt)

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: str) -> Response:
        return Response(
            id=uuid.uuid4().hex,
            created=int(time.time()),
            model="plugrl",
            message=ResponseMessage(content=response, finish_reason="stop", is_truncated=False),
        )

    async def close(self) -> None:
        return None


class VerifiersEnvironment(Environment):
    """One episode of a verifiers environment.

    The row becomes verifiers' rollout input: its ``prompt`` messages (after the
    environment's ``system_prompt``, unless they open with a system message), ``answer`` (or
    a verl-style ``reward_model.ground_truth``) and ``info`` (or ``extra_info``).
    """

    config: VerifiersConfig

    def __init__(self, config: VerifiersConfig, context: PartContext | None) -> None:
        super().__init__(config, context)
        self.env = load(config)
        self.rollout: asyncio.Task | None = None
        self.requests: asyncio.Queue = asyncio.Queue()
        self.reply: asyncio.Future | None = None
        self.seen = 0  # messages of the conversation the model has seen

    async def model_turn(self, prompt: list[Any]) -> str:
        self.reply = asyncio.get_running_loop().create_future()
        await self.requests.put(prompt)
        return await self.reply

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        ground_truth = (row.get("reward_model") or {}).get("ground_truth", "")
        prompt = [dict(message) for message in row["prompt"]]
        # what verifiers does to the rows of its own datasets
        system_prompt = getattr(self.env, "system_prompt", None)
        if system_prompt and (not prompt or prompt[0].get("role") != "system"):
            prompt.insert(0, {"role": "system", "content": system_prompt})
        rollout_input = {
            "prompt": prompt,
            "example_id": int(row.get("index", 0) or 0),
            "answer": str(row.get("answer", ground_truth)),
            "info": row.get("info", row.get("extra_info") or {}),
        }
        self.rollout = asyncio.create_task(self._play(rollout_input))
        ended = await self._next()
        if ended is not None:
            raise ValueError(
                "the verifiers rollout ended before asking for a model turn"
                + (f": {ended['error']!r}" if ended.get("error") is not None else "")
            )
        return self._new_messages()

    async def step(self, message: str) -> StepResult:
        assert self.reply is not None, "step before reset"
        self.reply.set_result(message)
        self.seen += 1  # the model's own turn
        state = await self._next()
        if state is None:
            return StepResult(observation=self._new_messages())
        if state.get("error") is not None:
            raise RuntimeError(f"the verifiers rollout failed: {state['error']!r}")
        metrics = {
            key: float(value)
            for key, value in (state.get("metrics") or {}).items()
            if isinstance(value, numbers.Real)
        }
        return StepResult(
            observation=[], reward=float(state.get("reward") or 0.0), done=True, metrics=metrics
        )

    async def close(self) -> None:
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
            # wait for it to unwind without taking its cancellation as ours
            await asyncio.wait({self.rollout})

    async def _play(self, rollout_input: dict[str, Any]) -> Any:
        state = await self.env.rollout(rollout_input, _Bridge(self), "plugrl", {})
        if state.get("error") is None:
            await self.env.rubric.score_rollout(state)
        await self.env.rubric.cleanup(state)
        return state

    async def _next(self) -> Any:
        """``None`` when the rollout asks for the next model turn (its prompt kept in
        ``self.prompt``); the final state when it ended."""
        assert self.rollout is not None
        request = asyncio.ensure_future(self.requests.get())
        done, _ = await asyncio.wait({request, self.rollout}, return_when=asyncio.FIRST_COMPLETED)
        if request in done:
            self.prompt = request.result()
            return None
        request.cancel()
        return self.rollout.result()

    def _new_messages(self) -> list[Message]:
        """The messages of the last request the model has not seen, as plain dicts."""
        new = [as_dict(m) for m in self.prompt[self.seen :]]
        self.seen = len(self.prompt)
        return new


def as_dict(message: Any) -> Message:
    """A verifiers message (a pydantic model, or already a dict) as a chat-template dict."""
    if isinstance(message, Mapping):
        return dict(message)
    return message.model_dump(exclude_none=True)
