"""A skyrl-gym environment behind plugrl's :class:`~plugrl.parts.agent.Environment`.

skyrl-gym environments are synchronous (``init``, ``step``, ``close``); their calls run in a
worker thread so that the agent loops of other samples go on meanwhile. A call past
``rollout.agent.tool_timeout_s`` ends the trajectory, but the thread cannot be killed: it
finishes in the background.

Each episode is ``skyrl_gym.make(env_id, env_config=..., extras=...)``, as SkyRL makes it: the
extras are the row's columns (SkyRL's datasets carry ``reward_spec`` and ``extra_info``
there; a verl-style row's ``reward_model`` is passed as ``reward_spec`` too) over
``env_args.extras``, with ``max_turns`` set to ``rollout.agent.max_turns`` unless given.
A step's ``postprocessed_action`` is not used: the trajectory keeps the tokens the model
sampled.
"""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Mapping
from typing import Any

import skyrl_gym
from omegaconf import OmegaConf

from plugrl.api import PartContext
from plugrl.api.agents import Environment, Message, StepResult
from plugrl_skyrl_gym.config import SkyrlGymConfig, registered_env_id

# what plugrl's data adds to a row, which a skyrl-gym environment has no use for
_NOT_EXTRAS = ("prompt", "raw_prompt_ids", "env_class")


class SkyrlGymEnvironment(Environment):
    """One episode of a skyrl-gym environment."""

    config: SkyrlGymConfig

    def __init__(self, config: SkyrlGymConfig, context: PartContext | None) -> None:
        super().__init__(config, context)
        self.env_id = registered_env_id(config.env_id) if config.env_id is not None else None
        self.env: Any = None

    async def reset(self, row: Mapping[str, Any]) -> list[Message] | None:
        env_id = self.env_id or row.get("env_class")
        if not env_id:
            raise ValueError(
                "rollout.agent.env_args.env_id: no skyrl-gym environment for this row; set "
                "env_id, or give the data an env_class column"
            )
        if self.env_id is None:
            env_id = registered_env_id(str(env_id))
        extras: dict[str, Any] = {"max_turns": self._max_turns(), **self.config.extras}
        extras.update((key, value) for key, value in row.items() if key not in _NOT_EXTRAS)
        if "reward_spec" not in extras and "reward_model" in row:
            extras["reward_spec"] = row["reward_model"]
        env_config = OmegaConf.create(dict(self.config.env_config))
        self.env = await asyncio.to_thread(
            skyrl_gym.make, env_id, env_config=env_config, extras=extras
        )
        prompt = row.get("prompt")
        if prompt is None:
            raise ValueError(
                f"a skyrl-gym episode ({env_id}) starts from the row's prompt messages, and "
                f"this row has no prompt column"
            )
        messages, _ = await asyncio.to_thread(self.env.init, [dict(m) for m in prompt])
        return list(messages)

    async def step(self, message: str) -> StepResult:
        output = await asyncio.to_thread(self.env.step, message)
        done = bool(output["done"])
        metrics: dict[str, float] = {}
        if done and hasattr(self.env, "get_metrics"):
            metrics = {
                key: float(value)
                for key, value in self.env.get_metrics().items()
                if isinstance(value, numbers.Real)
            }
        return StepResult(
            observation=list(output.get("observations") or []),
            reward=float(output["reward"] or 0.0),
            done=done,
            metrics=metrics,
        )

    async def close(self) -> None:
        if self.env is not None:
            await asyncio.to_thread(self.env.close)

    def _max_turns(self) -> int:
        recipe = getattr(self.context, "recipe", None)
        return recipe.rollout.agent.max_turns if recipe is not None else 1
