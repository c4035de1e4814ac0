"""The agent runtime of a run: the agent loops, tools and parser built once, and the
:class:`AgentSession` each sample talks to the engines and tools through.

All the samples of a batch run their agent loops concurrently on one asyncio event loop, in a
thread of the runtime's own (the engine group's loop is another thread: a turn is a request
sent there with :meth:`EngineGroup.agenerate <plugrl.cluster.engines.EngineGroup.agenerate>`).

Seeds: turn 0 of sample ``s`` of prompt ``p`` samples exactly what the batched path
(:meth:`EngineGroup.generate <plugrl.cluster.engines.EngineGroup.generate>`) samples for it,
so a run whose rows all use ``single_turn`` draws the same responses through either path;
turn ``t > 0`` draws with ``derive_seed(step seed, p, s, t)``.

Tool failures never raise: a call that could not be read, names an unknown tool, has
arguments the tool refuses, raises or runs past ``rollout.agent.tool_timeout_s`` becomes a
:class:`~plugrl.parts.agent.ToolResult` with ``error`` set, whose text the model reads as the
tool's answer, and a counted metric.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.data.batch import MULTIMODAL_COLUMN
from plugrl.data.multimodal import IMAGE_PLACEHOLDER
from plugrl.errors import DataError, PluginError, PlugrlError, RecipeError
from plugrl.parts.agent import (
    AgentConfig,
    AgentLoop,
    Environment,
    ParsedTurn,
    Session,
    Tool,
    ToolArgumentError,
    ToolCall,
    ToolContext,
    ToolResult,
    Trajectory,
)
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import (
    GenerationRequest,
    continuation_request,
    derive_seed,
    join_completions,
)
from plugrl.recipe.build import tool_args
from plugrl.state.seeds import one_sample_request_seed

if TYPE_CHECKING:
    from plugrl.agents.images import TurnImages
    from plugrl.cluster.engines import EngineGroup
    from plugrl.data.multimodal import MultimodalData
    from plugrl.parts.rollout import Completion, SamplingParams
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.agents")

TRUNCATION_MARK = "...(truncated)"
"""Appended to a tool result cut to ``rollout.agent.max_tool_response_length`` tokens."""

INVALID_CALLS = "invalid"
"""The name under which calls that name no tool (unreadable, unknown) are counted."""


def truncate_text(tokenizer: Any, text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` tokens and marked with :data:`TRUNCATION_MARK`, and whether
    it was cut."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= limit:
        return text, False
    return tokenizer.decode(ids[:limit], skip_special_tokens=False) + TRUNCATION_MARK, True


@attrs.define
class _Counters:
    """What one sample's tool calls did, turned into ``Trajectory.metrics``."""

    calls: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))
    errors: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))
    latency_s: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    truncated: int = 0

    def metrics(self) -> dict[str, float]:
        out = {
            "tool_calls": float(sum(self.calls.values())),
            "tool_errors": float(sum(self.errors.values())),
            "tool_truncated": float(self.truncated),
        }
        for name in sorted(set(self.calls) | set(self.errors)):
            out[f"tool/{name}/calls"] = float(self.calls.get(name, 0))
            out[f"tool/{name}/errors"] = float(self.errors.get(name, 0))
            if name in self.latency_s:
                out[f"tool/{name}/latency_s"] = self.latency_s[name]
        return out


class ToolCaller:
    """Runs the tool calls of one sample: at most ``config.max_parallel_calls`` of a turn,
    concurrently, each under ``config.tool_timeout_s`` and ``in_flight`` (the run-wide limit
    of calls running); every failure becomes an error :class:`ToolResult` the model reads.
    Counts calls, errors, latencies and truncations in ``counters``; ``last_reward`` is the
    sum of the rewards the last turn's calls gave. :class:`AgentSession` and
    :class:`plugrl.testing.ScriptedSession` call tools through it."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        config: AgentConfig,
        tokenizer: Any,
        *,
        sample_id: str,
        in_flight: asyncio.Semaphore | None = None,
        record_metric: Callable[[str, str, float], None] | None = None,
        record_raise: Callable[[str, BaseException], None] | None = None,
        images: TurnImages | None = None,
    ) -> None:
        self.tools = tools
        self.images = images
        self.record_raise = record_raise
        self.config = config
        self.tokenizer = tokenizer
        self.sample_id = sample_id
        self.in_flight = in_flight
        self.record_metric = record_metric
        self.counters = _Counters()
        self.last_reward: float | None = None

    async def call_all(self, calls: Sequence[ToolCall], row: Mapping[str, Any]) -> list[ToolResult]:
        """One result per call of ``calls``, in order."""
        if self.in_flight is None:
            # made here, on the loop the calls run on
            self.in_flight = asyncio.Semaphore(self.config.max_tools_in_flight)
        limit = self.config.max_parallel_calls
        self.last_reward = None
        running = [self._call_one(call, row) for call in calls[:limit]]
        results: list[ToolResult] = list(await asyncio.gather(*running))
        for call in calls[limit:]:
            self._count(call.name or INVALID_CALLS, error=True)
            results.append(
                _failed(
                    f"Error: at most {limit} tool calls are run per turn; call {call.name!r} "
                    "was not run."
                )
            )
        return results

    def _count(self, name: str, *, error: bool, latency_s: float | None = None) -> None:
        counters = self.counters
        key = name if name in self.tools else INVALID_CALLS
        counters.calls[key] += 1
        if error:
            counters.errors[key] += 1
        if latency_s is not None:
            counters.latency_s[key] += latency_s

    async def _call_one(self, call: ToolCall, row: Mapping[str, Any]) -> ToolResult:
        if call.error is not None:
            self._count(INVALID_CALLS, error=True)
            return _failed(f"Error: the tool call could not be read ({call.error}).")
        tool = self.tools.get(call.name)
        if tool is None:
            self._count(INVALID_CALLS, error=True)
            known = ", ".join(sorted(self.tools)) or "none"
            return _failed(f"Error: unknown tool {call.name!r}; the tools are: {known}.")
        context = ToolContext(row=row, sample_id=self.sample_id)
        timeout = self.config.tool_timeout_s
        assert self.in_flight is not None
        async with self.in_flight:
            start = time.perf_counter()
            try:
                answer = await asyncio.wait_for(tool.call(call.arguments or {}, context), timeout)
            except ToolArgumentError as exc:
                result = _failed(f"Error: bad arguments for tool {call.name!r}: {exc}")
            except TimeoutError:
                result = _failed(f"Error: tool {call.name!r} timed out after {timeout:g} s.")
            except Exception as exc:
                result = _failed(f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}")
                # the model reads the error, but it is the tool's bug: the run says so too
                if self.record_raise is not None:
                    self.record_raise(call.name, exc)
            else:
                if isinstance(answer, ToolResult):
                    result = attrs.evolve(
                        answer, metrics=dict(answer.metrics), images=list(answer.images)
                    )
                else:
                    result = ToolResult(text=str(answer))
                if result.images:
                    result = self._decoded_images(call.name, result)
                if result.reward is not None:
                    self.last_reward = (self.last_reward or 0.0) + result.reward
                if self.record_metric is not None:
                    for key, value in result.metrics.items():
                        self.record_metric(call.name, key, value)
            latency = time.perf_counter() - start
        self._count(call.name, error=result.error, latency_s=latency)
        result.text, cut = truncate_text(
            self.tokenizer, result.text, self.config.max_tool_response_length
        )
        if cut and result.images and self.images is not None:
            marked = self.images.count_placeholders(result.text)
            if marked != len(result.images):
                # the cut took some images' places: all of them go before the text
                result.text = result.text.replace(IMAGE_PLACEHOLDER, "")
        self.counters.truncated += int(cut)
        return result

    def _decoded_images(self, name: str, result: ToolResult) -> ToolResult:
        """``result`` with its images decoded; a tool whose images the run cannot show (a
        text model, an image that cannot be decoded, places that do not match the images) gets
        a failed result the model reads, and the run logs the tool's bug."""
        what = f"tool {name!r} result"
        try:
            if self.images is None:
                raise DataError(
                    f"{what} has {len(result.images)} images, but the run's model is not a "
                    "vision-language model; return images only to a vision-language model"
                )
            images = self.images.decode(result.images, what=what)
            self.images.place(result.text, len(images), what=what)
        except DataError as exc:
            if self.record_raise is not None:
                self.record_raise(name, exc)
            return _failed(f"Error: {exc}")
        return attrs.evolve(result, images=images)


def _failed(text: str) -> ToolResult:
    return ToolResult(text=text, error=True)


def _joined(image_inputs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The image inputs of a sequence's images as one request takes them (each key's tensors
    joined in order), ``None`` without images."""
    if not image_inputs:
        return None
    from plugrl.data.multimodal import model_inputs

    return model_inputs(list(image_inputs))


class AgentSession(Session):
    """The run's :class:`~plugrl.parts.agent.Session` for one sample: sample ``sample_index``
    of prompt ``prompt_index`` of a batch sampled with ``params``."""

    def __init__(
        self,
        runtime: AgentRuntime,
        *,
        sample_id: str,
        prompt_index: int,
        sample_index: int,
        params: SamplingParams,
        request_prefix: str,
    ) -> None:
        self.runtime = runtime
        self.sample_id = sample_id
        self.tokenizer = runtime.tokenizer
        self.config = runtime.config
        self.max_response_length = runtime.recipe.data.max_response_length
        self.prompt_index = prompt_index
        self.sample_index = sample_index
        self.params = params
        self.request_prefix = request_prefix
        self.turn = 0
        """Turns generated so far."""
        self.last_tool_reward: float | None = None
        self.images = runtime.images
        self.tool_caller = ToolCaller(
            runtime.tools,
            runtime.config,
            runtime.tokenizer,
            sample_id=sample_id,
            in_flight=runtime.tools_in_flight,
            record_metric=runtime.record_tool_metric,
            record_raise=runtime.record_tool_raise,
            images=runtime.images,
        )

    def turn_seed(self, turn: int) -> int | None:
        """The seed turn ``turn`` of this sample draws with (``None`` when unseeded)."""
        if self.params.seed is None:
            return None
        indices = (self.prompt_index, self.sample_index) + ((turn,) if turn else ())
        return one_sample_request_seed(derive_seed(self.params.seed, *indices))

    async def generate(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        image_inputs: Sequence[Mapping[str, Any]] = (),
    ) -> Completion:
        max_tokens = max(0, int(max_tokens))
        turn_cap = self.config.max_turn_tokens
        capped = turn_cap is not None and turn_cap < max_tokens
        params = attrs.evolve(
            self.params,
            n=1,
            max_tokens=turn_cap if capped else max_tokens,
            seed=self.turn_seed(self.turn),
        )
        request = GenerationRequest(
            request_id=f"{self.request_prefix}-{self.prompt_index}-{self.sample_index}"
            f"-t{self.turn}",
            prompt_ids=token_ids,
            params=params,
            multi_modal_inputs=_joined(image_inputs),
        )
        self.turn += 1
        engines = self.runtime.engines
        (completion,) = await engines.agenerate(request)
        part = 0
        # a weight sync that ends requests in flight (partial rollout without pausing in
        # place): the turn goes on from its tokens on the new weights
        while (
            completion.finish_reason == "aborted"
            and self.runtime.continue_aborted
            and len(completion.token_ids) < params.max_tokens
        ):
            part += 1
            follow = continuation_request(
                request, completion, request_id=f"{request.request_id}+{part}"
            )
            (rest,) = await engines.agenerate(follow)
            completion = join_completions(completion, rest)
        if capped and completion.finish_reason == "length":
            # rollout.agent.max_turn_tokens, not the trajectory's budget, ended the turn: the
            # loop reads it as a turn that ended and goes on
            completion.finish_reason = "stop"
        return completion

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.runtime.tools.values()]

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        return self.runtime.parse_tool_calls(text)

    async def call_tools(
        self, calls: Sequence[ToolCall], row: Mapping[str, Any]
    ) -> list[ToolResult]:
        results = await self.tool_caller.call_all(calls, row)
        self.last_tool_reward = self.tool_caller.last_reward
        return results

    @property
    def counters(self) -> _Counters:
        """What this sample's tool calls did so far."""
        return self.tool_caller.counters

    def make_environment(self) -> Environment:
        return self.runtime.make_environment()


class AgentRuntime:
    """What the agent loops of a run share: the loops, tools and tool-call parser, built once
    from ``rollout.agent``; the limit of tool calls in flight; and the event-loop thread the
    samples run on. Built on the first batch that needs it; :meth:`close` ends it."""

    def __init__(
        self,
        recipe: Recipe,
        plugins: PluginManager,
        tokenizer: Any,
        engines: EngineGroup,
        multimodal: MultimodalData | None = None,
    ) -> None:
        from plugrl.agents.images import TurnImages
        from plugrl.loop_thread import EventLoopThread

        self.recipe = recipe
        self.images = TurnImages(multimodal, tokenizer) if multimodal is not None else None
        """A vision-language model's images in the loops (``Session.images``), else None."""
        self.plugins = plugins
        self.tokenizer = tokenizer
        self.engines = engines
        self.config: AgentConfig = recipe.rollout.agent
        self.parser = plugins.registry("tool_parsers").get(self.config.tool_parser).load()
        self.parser_failures = 0
        self.tools: dict[str, Tool] = {}
        self._loops: dict[str, AgentLoop] = {}
        self._batches = 0
        self.continue_aborted = False
        """Continue a turn a weight sync aborted (set by a scheduler whose syncs abort the
        requests in flight); otherwise the turn ends ``aborted`` and so does its trajectory."""
        self._tool_metrics: dict[str, list[float]] = defaultdict(list)
        self._tools_that_raised: set[str] = set()
        self._tool_raises: dict[str, tuple[int, str]] = {}
        self._raises_lock = threading.Lock()  # counted on the samples' thread, read on the run's
        self._thread = EventLoopThread("plugrl-agents")
        # created on the runtime's own loop, where every call that waits on it runs
        self.tools_in_flight: asyncio.Semaphore = self._thread.submit(
            _make_semaphore(self.config.max_tools_in_flight)
        ).result()
        try:
            for name in self.config.tools:
                tool = self._build("tools", name, tool_args(recipe, name, plugins))
                self.tools[tool.name or name] = tool
            if self.config.tool_config_path:
                self._add_verl_tools(self.config.tool_config_path)
        except BaseException:
            self.close()
            raise

    def _add_verl_tools(self, path: str) -> None:
        """The tools of a verl tool YAML file, beside those of ``rollout.agent.tools``."""
        from plugrl.agents.verl_tools import KEY, tools_from_verl_yaml

        context = PartContext(recipe=self.recipe, plugins=self.plugins, tokenizer=self.tokenizer)
        for tool in tools_from_verl_yaml(path, context):
            if tool.name in self.tools:
                raise RecipeError(
                    f"the tool {tool.name!r} of {path} has the name of a tool of "
                    "rollout.agent.tools; rename one of them",
                    key=KEY,
                )
            self.tools[tool.name] = tool

    def _build(self, kind: str, name: str, config: Any) -> Any:
        from plugrl.plugin.build import build_part

        context = PartContext(recipe=self.recipe, plugins=self.plugins, tokenizer=self.tokenizer)
        return build_part(kind, name, config, context)

    def loop(self, name: str) -> AgentLoop:
        """The agent loop registered as ``name`` (an alias too), built on first use: with
        ``rollout.agent.loop_args`` when it is the run's loop, else its default options."""
        registry = self.plugins.registry("agent_loops")
        entry = registry.get(name)
        if entry.name not in self._loops:
            config_cls = entry.load_config()
            chosen = registry.get(self.config.loop).name == entry.name
            raw = dict(self.config.loop_args) if chosen else {}
            config = None
            if config_cls is not None:
                from plugrl.config.structuring import structure

                config = structure(config_cls, raw, "rollout.agent.loop_args")
            self._loops[entry.name] = self._build("agent_loops", entry.name, config)
        return self._loops[entry.name]

    def make_environment(self) -> Environment:
        """A fresh instance of ``rollout.agent.env``."""
        name = self.config.env
        if name is None:
            raise RecipeError(
                "no environment is set; set rollout.agent.env to a registered environment "
                "(plugrl list environments)",
                key="rollout.agent.env",
            )
        entry = self.plugins.registry("environments").get(name)
        config_cls = entry.load_config()
        config = None
        if config_cls is not None:
            from plugrl.config.structuring import structure

            config = structure(config_cls, dict(self.config.env_args), "rollout.agent.env_args")
        return self._build("environments", name, config)

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        """``text`` read by the run's parser. A parser that raises (a bug in it, or input it
        did not foresee) does not end the run: the turn becomes one call that failed, which
        the model is told about; the first failure is logged with its traceback."""
        try:
            return self.parser(text)
        except Exception as exc:  # a parser's bug must not end the run
            self.parser_failures += 1
            name = self.config.tool_parser
            if self.parser_failures == 1:
                logger.warning(
                    "the tool-call parser %r raised on a model turn (%s: %s); the turn is "
                    "read as a failed call. A parser must return a ToolCall with error set "
                    "instead of raising",
                    name,
                    type(exc).__name__,
                    exc,
                    exc_info=not isinstance(exc, RecursionError),
                )
            else:
                logger.debug(
                    "the tool-call parser %r raised again (%d times)", name, self.parser_failures
                )
            error = f"the tool call could not be read ({type(exc).__name__})"
            call = ToolCall(id="call_0", name="", arguments=None, raw=text, error=error)
            return ParsedTurn(content="", tool_calls=[call])

    def record_tool_metric(self, tool: str, key: str, value: float) -> None:
        """A figure a tool reported with its result (``ToolResult.metrics``)."""
        self._tool_metrics[f"agent/tool/{tool}/{key}"].append(float(value))

    def record_tool_raise(self, tool: str, exc: BaseException) -> None:
        """A tool's own code raised (``tool`` is its ``name``, which its metrics are under):
        the first time for each tool, the traceback is logged at once; then the raises are
        counted and said once a step (:meth:`take_tool_metrics`)."""
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if tool not in self._tools_that_raised:
            self._tools_that_raised.add(tool)
            logger.warning(
                "tool %r raised %s; the model reads it as a failed call, but it is a bug in the "
                "tool (its metrics: agent/tool/%s/...)",
                tool,
                first,
                tool,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        with self._raises_lock:
            count, kept = self._tool_raises.get(tool, (0, first))
            self._tool_raises[tool] = (count + 1, kept)

    def take_tool_metrics(self) -> dict[str, float]:
        """The mean of each figure tools reported since the last call; logs how often each
        tool raised since then."""
        metrics = {key: sum(values) / len(values) for key, values in self._tool_metrics.items()}
        self._tool_metrics.clear()
        with self._raises_lock:
            raises, self._tool_raises = self._tool_raises, {}
        for tool, (count, first) in sorted(raises.items()):
            logger.warning("tool %r raised %d times this step; first: %s", tool, count, first)
            metrics[f"agent/tool/{tool}/raised"] = float(count)
        return metrics

    # ------------------------------------------------------------------------------ running

    def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        loop_names: Sequence[str],
        params: SamplingParams,
    ) -> list[list[list[Trajectory]]]:
        """``params.n`` samples of each row through its agent loop (blocking): for each row,
        for each sample, its sequences (one, unless the loop returned several)."""
        self._batches += 1
        return self.submit(rows, loop_names, params, f"agent{self._batches}").result()

    def submit(
        self,
        rows: Sequence[Mapping[str, Any]],
        loop_names: Sequence[str],
        params: SamplingParams,
        request_prefix: str,
    ) -> concurrent.futures.Future:
        """:meth:`run` without waiting, for a caller on another event loop or thread: the
        future gets the samples; cancelling it cancels them. Request ids start with
        ``request_prefix``, unique among the runtime's batches in flight."""
        return self._thread.submit(self._run_all(rows, loop_names, params, request_prefix))

    async def _run_all(
        self,
        rows: Sequence[Mapping[str, Any]],
        loop_names: Sequence[str],
        params: SamplingParams,
        prefix: str,
    ) -> list[list[list[Trajectory]]]:
        samples = [
            self._run_sample(row, loop_names[p], params, p, s, prefix)
            for p, row in enumerate(rows)
            for s in range(params.n)
        ]
        tasks = [asyncio.ensure_future(sample) for sample in samples]
        try:
            flat = await asyncio.gather(*tasks)
        except BaseException:
            # the first failure stops the run: the other samples are cancelled and awaited
            # here, not left pending for the loop's shutdown to complain about
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [flat[p * params.n : (p + 1) * params.n] for p in range(len(rows))]

    async def _run_sample(
        self,
        row: Mapping[str, Any],
        loop_name: str,
        params: SamplingParams,
        prompt_index: int,
        sample_index: int,
        prefix: str,
    ) -> list[Trajectory]:
        sample_id = f"{row.get('uid', prompt_index)}/{sample_index}"
        session = AgentSession(
            self,
            sample_id=sample_id,
            prompt_index=prompt_index,
            sample_index=sample_index,
            params=params,
            request_prefix=prefix,
        )
        loop = self.loop(loop_name)
        try:
            out = await loop.run(row, session)
        except PlugrlError:
            raise  # a loop's own one-line error (a recipe it cannot run) says its fix
        except Exception as exc:
            raise PluginError(
                f"agent loop {loop_name!r} failed on sample {sample_id}: "
                f"{type(exc).__name__}: {exc}; fix the loop (tool and environment errors are "
                "the model's to read, a loop's own are not)"
            ) from exc
        finally:
            for tool in self.tools.values():
                try:
                    await tool.release(sample_id)
                except Exception as exc:
                    logger.warning("tool %r could not release %s: %s", tool, sample_id, exc)
        trajectories = [out] if isinstance(out, Trajectory) else list(out)
        if not trajectories:
            raise PluginError(
                f"agent loop {loop_name!r} returned no trajectory for sample {sample_id}; "
                "return a Trajectory or a non-empty list of them"
            )
        limit = self.max_response_length
        for trajectory in trajectories:
            if not isinstance(trajectory, Trajectory):
                raise PluginError(
                    f"agent loop {loop_name!r} returned {type(trajectory).__name__} for sample "
                    f"{sample_id}; return plugrl.parts.agent.Trajectory objects"
                )
            try:
                trajectory.check()
            except ValueError as exc:
                raise PluginError(f"agent loop {loop_name!r}, sample {sample_id}: {exc}") from None
            if len(trajectory.response_ids) > limit:
                raise PluginError(
                    f"agent loop {loop_name!r} returned a response of "
                    f"{len(trajectory.response_ids)} tokens for sample {sample_id}, over "
                    f"data.max_response_length={limit}; cut appended tokens to what is left"
                )
            if trajectory.finish_reason == "error":
                trajectory.error = (
                    f"agent loop {loop_name!r}, sample {sample_id}: "
                    f"{trajectory.error or 'no reason given (see the warnings above)'}"
                )
        if row.get(MULTIMODAL_COLUMN) is not None and not trajectories[0].image_inputs:
            raise PluginError(
                f"agent loop {loop_name!r} returned a trajectory without the image inputs of "
                f"sample {sample_id}'s prompt images; a loop for rows with images puts them in "
                "Trajectory.image_inputs and passes them to session.generate (see the tool and "
                "env loops)"
            )
        last = trajectories[-1]
        last.metrics = {**session.counters.metrics(), **last.metrics}
        return trajectories

    @property
    def max_response_length(self) -> int:
        return self.recipe.data.max_response_length

    def close(self) -> None:
        """Close the agent loops and the tools, and stop the event-loop thread."""
        parts = [("agent loop", name, loop) for name, loop in self._loops.items()]
        parts += [("tool", name, tool) for name, tool in self.tools.items()]
        for kind, name, part in parts:
            try:
                part.close()
            except Exception as exc:  # closing must not hide the error that ended the run
                logger.warning("closing %s %r failed: %s", kind, name, exc)
        self._thread.stop()


async def _make_semaphore(value: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(value)
