"""``openai``: each sample runs the user's agent function against the run's OpenAI-compatible
endpoint (:mod:`plugrl_openai_agent.endpoint`), and becomes the trajectories its calls made.

The agent is ``rollout.agent.loop_args.agent``, ``package.module:function`` or
``path/to/file.py:function``::

    async def solve(row, client):          # client: openai.AsyncOpenAI on the sample's route
        answer = await client.chat.completions.create(model="plugrl", messages=row["prompt"])
        return 1.0 if "42" in answer.choices[0].message.content else 0.0

It is called with the keyword arguments it names, out of ``row`` (the dataset row; or its
first parameter whatever its name), ``client`` (an ``openai.AsyncOpenAI``, or ``openai.OpenAI``
for a plain function, which runs in a thread), ``base_url``, ``api_key``, ``model``,
``sample_id`` and the keys of ``loop_args.agent_args``; a ``**kwargs`` takes them all. It
returns the episode's reward (a number), or ``None`` to have the reward manager score the last
trajectory's text.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from plugrl.api import ConfigValueError, PartContext, RecipeError, non_negative, option, positive
from plugrl.api.agents import AgentLoop, AgentLoopConfig, Session, Trajectory
from plugrl_openai_agent.endpoint import OpenAIEndpoint

log = logging.getLogger(__name__)

AGENT_KEY = "rollout.agent.loop_args.agent"
API_KEY = "plugrl"
"""The key clients send (the endpoint checks none; the ``openai`` client needs one)."""
MAX_WARNINGS = 10
PROVIDED = ("row", "client", "base_url", "api_key", "model", "sample_id")


def _check_spec(name: str, value: str) -> None:
    target, sep, function = value.rpartition(":")
    if not (sep and target and function):
        raise ConfigValueError(
            name,
            f"set it to your agent function, 'package.module:function' or "
            f"'path/to/file.py:function' (got {value!r})",
        )


@attrs.define(kw_only=True)
class OpenAILoopConfig(AgentLoopConfig):
    """``rollout.agent.loop_args`` of the ``openai`` loop."""

    agent: str = option(
        "",
        "The agent function, 'package.module:function' or 'path/to/file.py:function'; "
        "called once per sample with an OpenAI client on the run's endpoint.",
        validator=lambda _, attribute, value: _check_spec(attribute.name, value),
    )
    agent_args: dict[str, Any] = option(
        factory=dict, help="More keyword arguments for the agent function."
    )
    model_name: str = option(
        "plugrl", "The model name the endpoint lists (requests may name any model)."
    )
    host: str = option("127.0.0.1", "Address the endpoint listens on.")
    port: int = option(0, "Port the endpoint listens on (0: a free one).", validator=non_negative)
    timeout_s: float = option(
        1800.0,
        "Seconds one sample's agent may run; then it is cancelled and its last trajectory "
        "ends with finish_reason error.",
        validator=positive,
    )


@attrs.frozen
class AgentFunction:
    """The loaded agent: what it is called, and which of the provided arguments it takes."""

    function: Callable[..., Any]
    label: str
    row_parameter: str
    takes: frozenset[str]
    """Names of :data:`PROVIDED` it takes (all of them with ``**kwargs``)."""
    is_async: bool


def load_agent(spec: str, agent_args: Mapping[str, Any]) -> AgentFunction:
    """The function ``spec`` names, checked against what the loop can pass it."""
    _check_spec(AGENT_KEY, spec)
    target, _, name = spec.rpartition(":")
    module = _import_file(target) if target.endswith(".py") else _import_module(target)
    function: Any = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise RecipeError(f"{target} has no {name!r}; name the agent function", key=AGENT_KEY)
    if not callable(function):
        raise RecipeError(f"{spec} is a {type(function).__name__}, not a function", key=AGENT_KEY)
    return _checked(function, spec, agent_args)


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RecipeError(
            f"cannot import {name!r} ({exc}); install the package that holds the agent, or "
            "give 'path/to/file.py:function'",
            key=AGENT_KEY,
        ) from None


def _import_file(path: str) -> Any:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise RecipeError(f"agent file {path!r} not found", key=AGENT_KEY)
    # a name unique to the path, so two files called agent.py do not collide
    module_name = (
        f"plugrl_agent_file_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:10]}"
    )
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RecipeError(f"{path} cannot be imported as Python", key=AGENT_KEY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise RecipeError(
            f"{path} failed to import: {type(exc).__name__}: {exc}; fix the file "
            f"(python {path} shows the traceback)",
            key=AGENT_KEY,
        ) from None
    return module


def _checked(
    function: Callable[..., Any], label: str, agent_args: Mapping[str, Any]
) -> AgentFunction:
    parameters = inspect.signature(function).parameters
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    named = {n: p for n, p in parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    row_parameter = "row"
    if "row" not in named:
        positional = [
            n
            for n, p in named.items()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in PROVIDED
        ]
        if not positional or parameters[positional[0]].kind is inspect.Parameter.POSITIONAL_ONLY:
            raise RecipeError(
                f"agent {label} takes no row: give it a first parameter for the dataset row",
                key=AGENT_KEY,
            )
        row_parameter = positional[0]
    takes = frozenset(PROVIDED) if any_keyword else frozenset(n for n in PROVIDED if n in named)
    if not takes & {"client", "base_url"} and not any_keyword:
        raise RecipeError(
            f"agent {label} takes neither client nor base_url, so it cannot call the model; "
            "add a client parameter",
            key=AGENT_KEY,
        )
    for key in agent_args:
        if key in PROVIDED or key == row_parameter:
            raise RecipeError(
                f"agent_args key {key!r} is an argument the loop provides; rename it",
                key="rollout.agent.loop_args.agent_args",
            )
        if key not in named and not any_keyword:
            raise RecipeError(
                f"agent {label} has no parameter {key!r}; remove it from agent_args or add it "
                "to the function",
                key="rollout.agent.loop_args.agent_args",
            )
    fillable = {row_parameter, *PROVIDED, *agent_args}
    missing = [
        n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in fillable
    ]
    if missing:
        raise RecipeError(
            f"agent {label} needs {', '.join(map(repr, missing))}, which the loop cannot "
            f"fill; give {'it' if len(missing) == 1 else 'them'} in agent_args or a default",
            key="rollout.agent.loop_args.agent_args",
        )
    return AgentFunction(
        function=function,
        label=label,
        row_parameter=row_parameter,
        takes=takes,
        # an object whose __call__ is async counts as an async function
        is_async=inspect.iscoroutinefunction(function)
        or inspect.iscoroutinefunction(type(function).__call__),
    )


class OpenAILoop(AgentLoop):
    """Runs :attr:`OpenAILoopConfig.agent` per sample against the run's endpoint, started on
    the first sample and stopped by :meth:`close`."""

    config: OpenAILoopConfig

    def __init__(self, config: OpenAILoopConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.agent = load_agent(config.agent, config.agent_args)
        self.endpoint = OpenAIEndpoint(config.host, config.port, config.model_name)
        self._started = False
        self._logged: set[str] = set()

    async def run(self, row: Mapping[str, Any], session: Session) -> list[Trajectory]:
        if not self._started:
            # binding and waiting for the server would hold up the other samples' loop
            await asyncio.to_thread(self.endpoint.start)
            self._started = True
        sample = self.endpoint.open(session.sample_id, session)
        reward: float | None = None
        error: str | None = None
        try:
            result = await asyncio.wait_for(
                self._call(row, session.sample_id), self.config.timeout_s
            )
            if result is not None and not isinstance(result, (int, float)):
                error = (
                    f"returned a {type(result).__name__}; return the episode's reward (a "
                    "number) or None"
                )
            elif result is not None:  # a bool too: solved or not
                reward = float(result)
        except asyncio.TimeoutError:
            error = f"took over {self.config.timeout_s:g} s (rollout.agent.loop_args.timeout_s)"
        except Exception as exc:
            error = f"raised {type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            self.endpoint.release(session.sample_id)
        trajectories = sample.recording.trajectories()
        if not trajectories:
            if error is None:
                error = "made no call to the model"
            prompt_ids = list(row.get("raw_prompt_ids", ()))
            trajectories = [Trajectory(prompt_ids=prompt_ids, finish_reason="error")]
        last = trajectories[-1]
        if error is not None:
            self._warn(f"agent {self.agent.label} {error}", session.sample_id)
            last.finish_reason = "error"
            last.error = f"agent {self.agent.label} {error}"
        last.reward = reward
        last.metrics.update(sample.metrics())
        last.metrics["agent_errors"] = float(error is not None)
        return trajectories

    async def _call(self, row: Mapping[str, Any], sample_id: str) -> Any:
        agent = self.agent
        base_url = self.endpoint.sample_url(sample_id)
        provided: dict[str, Any] = {
            "row": row,
            "base_url": base_url,
            "api_key": API_KEY,
            "model": self.config.model_name,
            "sample_id": sample_id,
        }
        kwargs = {n: v for n, v in provided.items() if n in agent.takes and n != "row"}
        # the agent may build its messages on the row's: the batch's row stays as it was
        kwargs[agent.row_parameter] = copy.deepcopy(dict(row))
        kwargs.update(self.config.agent_args)
        client = None
        if "client" in agent.takes:
            import openai

            make = openai.AsyncOpenAI if agent.is_async else openai.OpenAI
            client = make(
                base_url=base_url, api_key=API_KEY, max_retries=0, timeout=self.config.timeout_s
            )
            kwargs["client"] = client
        try:
            if agent.is_async:
                return await agent.function(**kwargs)
            # a plain function blocks: it runs in a thread, with a blocking client
            return await asyncio.to_thread(agent.function, **kwargs)
        finally:
            if client is not None:
                closed = client.close()
                if inspect.isawaitable(closed):
                    await closed

    def _warn(self, message: str, sample_id: str) -> None:
        # one line per kind of failure, not one per sample, and a few kinds at most (an
        # exception's text may differ from sample to sample)
        if message not in self._logged and len(self._logged) < MAX_WARNINGS:
            self._logged.add(message)
            log.warning(
                "%s (sample %s; later samples failing the same way are counted in agent_errors)",
                message,
                sample_id,
            )

    def close(self) -> None:
        """Stop the endpoint."""
        self.endpoint.stop()
