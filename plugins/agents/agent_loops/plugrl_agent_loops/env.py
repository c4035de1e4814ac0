"""``env``: an environment drives the turns. The model answers, the environment replies with an
observation, a reward and whether the episode is over, until it is over or a limit is reached.

Token in, token out: the sampled tokens of each turn are kept as the engine returned them; what
comes between turns (the close of the model's turn, the observation, the opening of the next
turn) is rendered by the tokenizer's chat template alone
(:func:`plugrl.agents.turns.tokens_between_turns`) and appended with ``loss_mask`` 0, so
earlier turns are never tokenized again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

from plugrl.api import DataError, PluginError, PlugrlError, RecipeError
from plugrl.api.agents import (
    AgentLoop,
    Environment,
    Message,
    Session,
    StepResult,
    Trajectory,
    text_between_turns,
    tokens_between_turns,
)
from plugrl.api.data import MULTIMODAL_COLUMN
from plugrl_agent_loops.tool import image_arguments

log = logging.getLogger(__name__)

TRUNCATED_MARK = " ...(truncated)"
"""Appended to an observation cut to ``rollout.agent.max_tool_response_length`` tokens, so the
model can tell it did not see all of it."""


class EnvLoop(AgentLoop):
    """Runs one episode of ``rollout.agent.env`` per sample.

    The opening messages are what the environment's ``reset`` returns, or the row's own prompt
    (``raw_prompt_ids`` as the data prepared it) when it returns ``None``. Each step's reward
    is put at the end of the turn it answers (``turn_rewards``) and the episode's reward is
    their sum. A ``reset``, ``step`` or ``close`` that raises or takes longer than
    ``rollout.agent.tool_timeout_s`` ends the trajectory with finish reason ``error`` and is
    counted in the trajectory's metrics; it never fails the run.

    With a vision-language model the prompt keeps the row's images, and an observation's
    images (``StepResult.images``) are appended with it, each expanded to its tokens, their
    image inputs kept in ``Trajectory.image_inputs``; an image that cannot be decoded (or
    images for a text model) ends the trajectory with ``error`` and its one-line reason, and
    images that could never fit ``data.max_response_length`` stop the run in one line.

    Metrics per trajectory (averaged into ``agent/...``): ``env/step_latency_s`` (mean seconds
    of one step), ``env/reward`` (the episode's reward), ``env/errors`` and ``env/timeouts``
    (1 when the episode ended so), ``env/truncated_observations`` (observations cut to
    ``max_tool_response_length``).
    """

    async def run(self, row: Mapping[str, Any], session: Session) -> Trajectory:
        env = session.make_environment()
        episode = _Episode(session)
        episode.env_name = type(env).__name__
        try:
            await episode.play(env, row)
        finally:
            await episode.guarded("close", env.close())
        return episode.finish()


class _EnvFailed(Exception):
    """An environment call raised or timed out; the episode ends with ``error``."""


class _Episode:
    """The state of one trajectory while its turns are played."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.tokenizer = session.tokenizer
        self.config = session.config
        self.trajectory = Trajectory(prompt_ids=[])
        self.step_latencies: list[float] = []
        self.truncated = 0
        self.failure: str | None = None  # "errors" or "timeouts"
        self.env_name = "the environment"
        self._schemas: list[dict[str, Any]] = []

    async def guarded(self, what: str, call: Any) -> Any:
        """Await an environment call under the timeout; a failure is recorded and raised as
        :class:`_EnvFailed` (``close`` failures are only recorded: the episode is over)."""
        try:
            return await asyncio.wait_for(call, timeout=self.config.tool_timeout_s)
        except asyncio.TimeoutError:
            log.warning(
                "environment %s of sample %s took longer than rollout.agent.tool_timeout_s "
                "(%ss); the trajectory ends with finish_reason error",
                what,
                self.session.sample_id,
                self.config.tool_timeout_s,
            )
            failure = "timeouts"
            reason = (
                f"environment {self.env_name}.{what} took longer than "
                f"rollout.agent.tool_timeout_s ({self.config.tool_timeout_s}s)"
            )
        except PlugrlError:
            raise  # a wrong return type: the environment's own fault, said in one line
        except Exception as exc:
            log.warning(
                "environment %s of sample %s raised %s: %s; the trajectory ends with "
                "finish_reason error",
                what,
                self.session.sample_id,
                type(exc).__name__,
                exc,
            )
            failure = "errors"
            reason = f"environment {self.env_name}.{what} raised {type(exc).__name__}: {exc}"
        if self.failure is None:
            self.failure = failure
            self.trajectory.finish_reason = "error"
            self.trajectory.error = reason.splitlines()[0] if reason else what
        if what != "close":
            raise _EnvFailed(what)
        return None

    async def play(self, env: Environment, row: Mapping[str, Any]) -> None:
        trajectory = self.trajectory
        try:
            opening = await self.guarded("reset", env.reset(row))
        except _EnvFailed:
            trajectory.prompt_ids = list(row.get("raw_prompt_ids", ()))
            return
        schemas = env.tools()
        self._schemas = schemas
        images = self.session.images
        if opening is None and "raw_prompt_ids" in row and not schemas:
            trajectory.prompt_ids = list(row["raw_prompt_ids"])
            messages = list(row.get("prompt") or [])
            if row.get(MULTIMODAL_COLUMN) is not None:
                trajectory.image_inputs.append(dict(row[MULTIMODAL_COLUMN]))
        else:
            if opening is None and not row.get("prompt"):
                raise ValueError(
                    f"the env agent loop has no opening messages for sample "
                    f"{self.session.sample_id}: the environment's reset returned None and "
                    f"the row has no prompt messages; return the opening messages from reset"
                )
            messages = list(opening if opening is not None else row["prompt"])
            shown = images.prompt_messages(messages, row) if images is not None else messages
            rendered = self.tokenizer.apply_chat_template(
                shown, tools=schemas or None, add_generation_prompt=True, tokenize=False
            )
            if images is not None:
                trajectory.prompt_ids, inputs = images.prompt(rendered, row)
                if inputs is not None:
                    trajectory.image_inputs.append(inputs)
            else:
                trajectory.prompt_ids = self.tokenizer.encode(rendered, add_special_tokens=False)
        trajectory.messages = messages
        limit = self.session.max_response_length
        while True:
            completion = await self.session.generate(
                [*trajectory.prompt_ids, *trajectory.response_ids],
                limit - len(trajectory.response_ids),
                **image_arguments(trajectory),
            )
            self._add_turn(completion)
            text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            if completion.finish_reason == "aborted":
                trajectory.finish_reason = "aborted"
                trajectory.turn_rewards.append(0.0)
                return
            started = time.perf_counter()
            try:
                result = await self.guarded("step", _checked_step(env, text))
            except _EnvFailed:
                trajectory.turn_rewards.append(0.0)
                return
            finally:
                self.step_latencies.append(time.perf_counter() - started)
            trajectory.turn_rewards.append(float(result.reward))
            for key, value in result.metrics.items():
                trajectory.metrics[f"env/{key}"] = float(value)
            # the turn's tokens ran out: the response is cut whatever the environment says
            if completion.finish_reason == "length" or len(trajectory.response_ids) >= limit:
                trajectory.finish_reason = "length"
                return
            if result.done:
                trajectory.finish_reason = "stop"
                return
            if trajectory.num_turns >= self.config.max_turns:
                trajectory.finish_reason = "max_turns"
                return
            observation = self._observation_messages(result.observation)
            inputs = None
            if result.images:
                try:
                    delta, inputs = self._with_images(observation, result, completion.token_ids)
                except DataError as exc:
                    self._failed_observation(str(exc))
                    return
            else:
                delta = tokens_between_turns(
                    self.tokenizer,
                    observation,
                    last_token_ids=completion.token_ids,
                    tools=schemas or None,
                )
            # the next turn needs room for at least one sampled token
            if len(trajectory.response_ids) + len(delta) >= limit:
                trajectory.finish_reason = "length"
                return
            messages.extend(observation)
            trajectory.add_appended(delta, inputs)

    def _with_images(
        self, observation: list[Message], result: StepResult, last_token_ids: Any
    ) -> tuple[list[int], dict[str, Any] | None]:
        """The tokens between turns with the observation's images in them, and their image
        inputs; images the run cannot show are a one-line :class:`DataError`."""
        images = self.session.images
        what = f"environment {self.env_name} observation"
        if images is None:
            raise DataError(
                f"{what} has {len(result.images)} images, but the run's model is not a "
                "vision-language model; return images only to a vision-language model"
            )
        placed = images.place_in_messages(observation, len(result.images), what=what)
        text = text_between_turns(
            self.tokenizer, placed, last_token_ids=last_token_ids, tools=self._schemas or None
        )
        delta, inputs = images.encode(text, result.images, what=what)
        image_tokens = images.image_tokens(delta)
        budget = self.session.max_response_length
        if image_tokens >= budget:
            raise RecipeError(
                f"sample {self.session.sample_id}: the {len(result.images)} images of {what} "
                f"are {image_tokens} tokens, more than data.max_response_length={budget} "
                "holds; raise it or return smaller images",
                key="data.max_response_length",
            )
        return delta, inputs

    def _failed_observation(self, reason: str) -> None:
        """An observation the model cannot be shown ends the trajectory with ``error``."""
        log.warning(
            "sample %s: %s; the trajectory ends with finish_reason error",
            self.session.sample_id,
            reason,
        )
        if self.failure is None:
            self.failure = "errors"
            self.trajectory.finish_reason = "error"
            self.trajectory.error = reason.splitlines()[0]

    def _add_turn(self, completion: Any) -> None:
        trajectory = self.trajectory
        trajectory.response_ids.extend(completion.token_ids)
        trajectory.loss_mask.extend([1] * len(completion.token_ids))
        trajectory.log_probs.extend(completion.log_probs)
        trajectory.token_versions.extend(completion.token_versions)
        trajectory.weight_version = completion.weight_version
        trajectory.num_turns += 1
        if completion.token_ids:
            trajectory.turn_ends.append(len(trajectory.response_ids) - 1)
        else:
            # an empty turn has no sampled token to carry its reward; the episode's reward
            # still counts it
            trajectory.turn_ends.append(-1)

    def _observation_messages(self, observation: str | list[Message]) -> list[Message]:
        """The observation as messages, each one's content cut to
        ``max_tool_response_length`` tokens."""
        if isinstance(observation, str):
            observation = [{"role": "user", "content": observation}]
        limit = self.config.max_tool_response_length
        messages = []
        for message in observation:
            content = message.get("content")
            if isinstance(content, str):
                ids = self.tokenizer.encode(content, add_special_tokens=False)
                if len(ids) > limit:
                    self.truncated += 1
                    content = self.tokenizer.decode(ids[:limit]) + TRUNCATED_MARK
                    message = {**message, "content": content}
            messages.append(message)
        return messages

    def finish(self) -> Trajectory:
        trajectory = self.trajectory
        # turn ends of empty turns carry no token; they are dropped with their rewards, whose
        # sum is still the episode's reward
        kept = [
            (end, reward)
            for end, reward in zip(trajectory.turn_ends, trajectory.turn_rewards, strict=True)
            if end >= 0
        ]
        trajectory.reward = float(sum(trajectory.turn_rewards))
        trajectory.turn_ends = [end for end, _ in kept]
        trajectory.turn_rewards = [reward for _, reward in kept]
        metrics = trajectory.metrics
        metrics["env/reward"] = trajectory.reward
        if self.step_latencies:
            metrics["env/step_latency_s"] = sum(self.step_latencies) / len(self.step_latencies)
        metrics["env/errors"] = float(self.failure == "errors")
        metrics["env/timeouts"] = float(self.failure == "timeouts")
        metrics["env/truncated_observations"] = float(self.truncated)
        trajectory.check()
        return trajectory


async def _checked_step(env: Environment, action: str) -> StepResult:
    """``env.step(action)``, its type checked: a step that is not a coroutine function or
    returns something else than a :class:`StepResult` stops the run in one line naming the
    environment (not this loop)."""
    name = type(env).__name__
    outcome = env.step(action)
    if not inspect.isawaitable(outcome):
        raise PluginError(
            f"environment {name}.step returned {type(outcome).__name__}, not a coroutine; "
            "define it as 'async def step(self, action) -> StepResult'"
        )
    result = await outcome
    if not isinstance(result, StepResult):
        raise PluginError(
            f"environment {name}.step returned {type(result).__name__}; return "
            "plugrl.api.agents.StepResult(observation=..., reward=..., done=...)"
        )
    return result
