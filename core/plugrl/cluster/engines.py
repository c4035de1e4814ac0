"""Rollout engines as workers, and the groups that drive them from the driver.

* :class:`EngineWorker` hosts one engine: it builds the device, runs the ``prepare_rollout``
  hook, builds the engine, and serves its coroutines. A plain class, so it runs in-process or
  wrapped as a Ray actor at run time (an asyncio actor: many requests in flight at once).
* :class:`EngineGroup` is what a scheduler holds: it spreads requests over the engines (the
  one with fewest in flight takes the next), answers every request exactly once, broadcasts
  control calls (pause, resume, sleep, weight updates), and restarts an engine worker that dies,
  giving its requests to the others and the new worker the current weights.
* :class:`LocalEngineGroup`: one engine in this process, on the group's event-loop thread.
* :class:`RayEngineGroup`: engine actors on devices of their own (``rollout.nnodes x
  rollout.n_gpus_per_node``, ``tensor_model_parallel_size`` devices per engine) or on the
  trainer's devices (``rollout.colocate``).

Colocated engines of ``tensor_model_parallel_size = tp`` devices follow verl's hybrid engine
layout: the trainer's ``W`` ranks sit on ``W`` bundles of one device each, and engine ``e`` of
the ``W / tp`` engines spans the devices of trainer ranks ``e*tp .. (e+1)*tp - 1``. Each engine
is one actor, on the first bundle of its span, that sees the devices of the whole span (the
device's ``visible_devices_env`` set to them, Ray told not to narrow it): the engine then starts
its tensor-parallel workers on those devices itself, as vLLM and SGLang do for an engine of
several devices, and takes the full weights, which it shards. The span's other bundles keep
their engine share unused. The engines sleep while the trainer trains and wake to generate,
as colocated engines of one device do.

An engine of more devices than a node has spans bundles of several nodes (colocated, or on
devices of its own, then bundles of one device each). Its actor still runs on the span's first
bundle, seeing that node's devices of the span and asking Ray for none of their shares; the
engine is told the rest of its span (``PartContext.engine_span``: each node's bundles, device
ids and the Ray options that place a worker there) and starts its tensor-parallel workers on
those nodes itself, as vLLM's Ray executor does. An engine class that cannot
(``RolloutEngine.spans_nodes`` false) is refused such a span in one line.

Every group method may be called from any thread except the group's own loop thread; the
``async`` ones from any other event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.cluster.worker import (
    build_device,
    node_id,
    node_ip,
    prepare_once,
    worker_plugin_manager,
)
from plugrl.errors import PluginError, PlugrlError
from plugrl.loop_thread import EventLoopThread
from plugrl.parts.context import EngineSpan, PartContext, SpanNode
from plugrl.parts.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    PauseMode,
    RolloutConfig,
    SamplingParams,
    WeightFingerprint,
    WeightMeta,
    batch_requests,
    in_prompt_order,
)

if TYPE_CHECKING:
    from plugrl.cluster.ray_group import RayPlacement
    from plugrl.parts.rollout import RolloutEngine
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import ModelConfig, Recipe

logger = logging.getLogger("plugrl.cluster")

WEIGHT_TIMEOUT_GRACE_S = 10.0
"""Seconds the driver waits past ``rollout.update_weights_timeout_s`` for a weight-update call
before it gives up on the engine's own loop answering."""


class EngineDied(Exception):
    """An engine worker's process is gone (raised inside a group, which restarts it)."""


# --------------------------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------------------------


class EngineWorker:
    """One rollout engine, in the process (and on the event loop) that serves it."""

    def __init__(
        self,
        recipe: Recipe,
        device_name: str,
        index: int = 0,
        plugin_modules: Iterable[str] = (),
        *,
        model_from_trainer: bool = False,
        engine_span: EngineSpan | None = None,
    ) -> None:
        self.recipe = recipe
        self.device_name = device_name
        self.index = index
        self.plugin_modules = list(plugin_modules)
        self.model_from_trainer = model_from_trainer
        self.engine_span = engine_span
        self.engine: RolloutEngine | None = None

    async def start(self, plugins: PluginManager | None = None) -> dict[str, Any]:
        """Build the engine; returns ``{"pid", "capabilities", "node", "rank_nodes"}``
        (``node``: its machine's address and Ray node id, ``None`` outside Ray;
        ``rank_nodes``: :attr:`RolloutEngine.rank_nodes`)."""
        from plugrl.data.dataset import load_tokenizer
        from plugrl.plugin.build import build_part

        self.plugins = plugins = plugins or worker_plugin_manager(self.plugin_modules)
        device = build_device(plugins, self.device_name, self.recipe)
        device.set_device(0)
        name = self.recipe.rollout.engine
        plugins.registry("rollout_engines").get(name).check_available()
        prepare_once(plugins, "rollout_engines", device.name, name, self.recipe)
        model = self.recipe.model
        context = PartContext(
            recipe=self.recipe,
            plugins=plugins,
            device=device,
            # engines of models without a folder (tests, custom engines) get no tokenizer
            tokenizer=load_tokenizer(model) if model.tokenizer_path or model.path else None,
            model_from_trainer=self.model_from_trainer,
            engine_span=self.engine_span,
        )
        self.engine = build_part("rollout_engines", name, self.recipe.rollout, context)
        node = node_id()
        return {
            "pid": os.getpid(),
            "capabilities": sorted(c.value for c in type(self.engine).capabilities),
            "node": (node_ip(), node) if node else None,
            "rank_nodes": getattr(self.engine, "rank_nodes", None),
        }

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("the engine worker has no engine; call start() first")
        return self.engine

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        return await self._engine().generate_request(request)

    async def score_tokens(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list:
        return await self._engine().score_tokens(prompt_ids, response_ids)

    async def abort(self, request_ids: Sequence[str]) -> None:
        await self._engine().abort(request_ids)

    async def pause(self, mode: PauseMode = "keep") -> None:
        await self._engine().pause(mode)

    async def resume(self) -> None:
        await self._engine().resume()

    async def sleep(self, level: int = 1) -> None:
        await self._engine().sleep(level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self._engine().wake_up(tags)

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        await self._engine().begin_weight_update(version, weights)

    async def load_weights(self, bucket: Sequence[tuple[str, Any]]) -> None:
        await self._engine().load_weights(bucket)

    async def weight_fingerprints(self, names: Sequence[str]) -> dict[str, Any]:
        return await self._engine().weight_fingerprints(names)

    async def finish_weight_update(self) -> int:
        engine = self._engine()
        await engine.finish_weight_update()
        return engine.weight_version

    async def bind_model(self, model: Any, version: int) -> None:
        self._engine().bind_model(model, version)

    async def transport_receive(self, transport_name: str, session: Any) -> Any:
        """Run the worker side of a weight transport in this engine worker."""
        from plugrl.plugin.build import build_part

        engine = self._engine()
        context = PartContext(
            recipe=self.recipe,
            plugins=self.plugins,
            device=engine.context.device,
        )
        transport = build_part("weight_transports", transport_name, self.recipe.rollout, context)
        return await transport.receive(engine, session)

    async def weight_version(self) -> int:
        return self._engine().weight_version

    async def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


class EngineGroup(ABC):
    """The engine workers of a run, driven as one."""

    in_process: bool = False
    """The engines live in this process (a local group)."""

    def __init__(self, recipe: Recipe, num_engines: int, capabilities: Iterable[str]) -> None:
        self.recipe = recipe
        self.num_engines = num_engines
        self.capabilities = frozenset(Capability(c) for c in capabilities)
        self.weight_version = 0
        """The version the engines hold (the last finished update or bound model)."""
        self.restarts = 0
        self.on_restart: Callable[[list[int]], None] | None = None
        """Called (in a thread of its own) with the indices of engines that were restarted,
        before they take requests: it must give them the current weights, as
        :meth:`WeightTransport.push` with ``engine_indices`` does."""
        self._in_flight: list[dict[str, GenerationRequest]] = [{} for _ in range(num_engines)]
        self._recovering: dict[int, asyncio.Future] = {}
        self._resyncing: set[int] = set()
        self._paused: PauseMode | None = None
        self._batch_ids = itertools.count()
        self._score_turns = itertools.count()
        self._thread = EventLoopThread(f"plugrl-engines-{recipe.rollout.engine}")

    # ---------------------------------------------------------------------- how calls travel

    @abstractmethod
    async def _call(self, index: int, method: str, *args: Any) -> Any:
        """Call ``method`` of engine worker ``index``, on the group's loop; raise
        :class:`EngineDied` when its process is gone."""

    async def _restart(self, index: int) -> None:
        """Replace engine worker ``index`` by a new one (engines that cannot die raise)."""
        raise RuntimeError(f"engine worker {index} cannot be restarted")

    def _blocking(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return self._thread.submit(coroutine).result()

    # ---------------------------------------------------------------------- requests

    def submit(
        self, request: GenerationRequest, engine_index: int | None = None
    ) -> concurrent.futures.Future:
        """Send ``request`` to an engine (the least busy, or ``engine_index``); the future
        gets its completions. Thread-safe."""
        return self._thread.submit(self._generate(request, engine_index))

    async def agenerate(
        self, request: GenerationRequest, engine_index: int | None = None
    ) -> list[Completion]:
        """:meth:`submit` for a caller on another event loop."""
        return await asyncio.wrap_future(self.submit(request, engine_index))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        on_finished: Callable[[int, list[Completion]], None] | None = None,
        images: Sequence[Mapping[str, Any] | None] | None = None,
        encoded_images: Sequence[Sequence[bytes]] | None = None,
        encoded_videos: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    ) -> list[Completion]:
        """``params.n`` responses per prompt, grouped by prompt in prompt order (blocking):
        one request per prompt, spread over the engines, each seeded from ``params.seed`` by
        its position so the batch samples the same on any number of engines. ``images``:
        each prompt's image inputs (a vision-language model's ``multi_modal_inputs``);
        ``encoded_images``: the same images encoded (its ``prompt_images``);
        ``encoded_videos``: its videos' sampled frames (its ``prompt_videos``).

        ``on_finished(prompt_index, completions)`` is called in the calling thread with each
        prompt's completions (in any order) as soon as its request ends, while the others
        still generate."""
        params.check()
        prefix = f"batch{next(self._batch_ids)}"
        requests = batch_requests(prompts, params, prefix, images, encoded_images, encoded_videos)
        futures: list[concurrent.futures.Future] = [concurrent.futures.Future() for _ in requests]
        self._blocking(self._start_together(requests, futures))
        if on_finished is not None:
            prompt_index = {future: index for index, future in enumerate(futures)}
            for future in concurrent.futures.as_completed(futures):
                on_finished(prompt_index[future], future.result())
        return in_prompt_order([future.result() for future in futures])

    async def _start_together(
        self, requests: Sequence[GenerationRequest], futures: Sequence[concurrent.futures.Future]
    ) -> None:
        """Start every request of a batch in one turn of the loop, in order, each settling
        its future. Sent one by one from another thread, the first requests could start
        decoding before the last arrived: which engine gets a request, and the batches an
        engine decodes (whose shapes move its numbers in the last bits), would then depend
        on the threads' timing, and two runs of one seed would differ."""
        for request, future in zip(requests, futures, strict=True):
            task = asyncio.ensure_future(self._generate(request, None))
            task.add_done_callback(functools.partial(_settle, future))

    def submit_score(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> concurrent.futures.Future:
        """Ask an engine (in turn) for the log-probability of each of ``response_ids`` after
        ``prompt_ids`` (:meth:`RolloutEngine.score_tokens`); the future gets the list.
        Thread-safe. The engines must declare :data:`Capability.SCORE`."""
        if Capability.SCORE not in self.capabilities:
            raise PluginError(
                f"rollout engine {self.recipe.rollout.engine!r} cannot score given tokens (it "
                "does not declare Capability.SCORE); serve the model with an engine that does"
            )
        index = next(self._score_turns) % self.num_engines
        return self._thread.submit(
            self._call_alive(index, "score_tokens", list(prompt_ids), list(response_ids))
        )

    def in_flight(self) -> int:
        return sum(len(requests) for requests in self._in_flight)

    def _pick(self) -> int:
        return min(range(self.num_engines), key=lambda i: len(self._in_flight[i]))

    async def _generate(self, request: GenerationRequest, engine_index: int | None) -> Any:
        while True:
            index = self._pick() if engine_index is None else engine_index
            await self._wait_recovered(index)
            self._in_flight[index][request.request_id] = request
            try:
                return await self._call(index, "generate_request", request)
            except EngineDied as exc:
                logger.warning(
                    "engine worker %d died (%s); restarting it and sending its requests again",
                    index,
                    exc,
                )
                await self._recover(index)
            finally:
                self._in_flight[index].pop(request.request_id, None)

    # ---------------------------------------------------------------------- recovery

    async def _wait_recovered(self, index: int) -> None:
        recovering = self._recovering.get(index)
        if recovering is not None:
            await asyncio.shield(recovering)

    async def _recover(self, index: int) -> None:
        """Restart worker ``index`` once, however many of its calls saw it die."""
        recovering = self._recovering.get(index)
        if recovering is None:
            recovering = asyncio.ensure_future(self._restart_and_resync(index))
            self._recovering[index] = recovering
            recovering.add_done_callback(lambda _: self._recovering.pop(index, None))
        await asyncio.shield(recovering)

    async def _restart_and_resync(self, index: int) -> None:
        limit = self.recipe.rollout.max_engine_restarts
        if self.restarts >= limit:
            raise PluginError(
                f"engine worker {index} died after {self.restarts} restarts already "
                f"(rollout.max_engine_restarts={limit}); see the worker's log for why"
            )
        self.restarts += 1
        await self._restart(index)
        # the new worker is up; control calls reach it now (the weight push below is made of
        # them), requests only once it has the current weights
        self._resyncing.add(index)
        try:
            if self.on_restart is not None and self.weight_version > 0:
                await asyncio.get_running_loop().run_in_executor(None, self.on_restart, [index])
            if self._paused is not None:
                await self._call(index, "pause", self._paused)
        finally:
            self._resyncing.discard(index)
        logger.info("engine worker %d is back (restart %d)", index, self.restarts)

    async def _call_alive(self, index: int, method: str, *args: Any) -> Any:
        """A control call that survives one death of the worker."""
        if index not in self._resyncing:
            await self._wait_recovered(index)
        try:
            return await self._call(index, method, *args)
        except EngineDied:
            await self._recover(index)
            return await self._call(index, method, *args)

    async def _broadcast(self, method: str, *args: Any, indices: Sequence[int] | None) -> list:
        targets = range(self.num_engines) if indices is None else indices
        return list(await asyncio.gather(*(self._call_alive(i, method, *args) for i in targets)))

    # ---------------------------------------------------------------------- control

    def abort(self, request_ids: Sequence[str]) -> None:
        """End the named requests; they return what they have (``"aborted"``)."""
        ids = list(request_ids)
        self._blocking(self._broadcast("abort", ids, indices=None))

    def abort_all(self) -> None:
        """End every request in flight."""
        self._blocking(self._abort_all())

    async def _abort_all(self) -> None:
        await asyncio.gather(
            *(
                self._call_alive(i, "abort", list(requests))
                for i, requests in enumerate(self._in_flight)
                if requests
            )
        )

    def pause(self, mode: PauseMode = "keep") -> None:
        """Pause every engine (see :meth:`RolloutEngine.pause`); blocks until they are."""
        self._blocking(self._broadcast("pause", mode, indices=None))
        self._paused = mode

    def resume(self) -> None:
        self._paused = None
        self._blocking(self._broadcast("resume", indices=None))

    def sleep(self, level: int = 1) -> None:
        self._blocking(self._broadcast("sleep", level, indices=None))

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self._blocking(self._broadcast("wake_up", list(tags) if tags else None, indices=None))

    # ---------------------------------------------------------------------- weights

    @property
    def weight_timeout_s(self) -> float:
        """Seconds one phase of a weight update may take in an engine
        (``rollout.update_weights_timeout_s``)."""
        return float(self.recipe.rollout.update_weights_timeout_s)

    def _stalled(self, index: int | None, method: str) -> PluginError:
        engine = f"rollout engine {self.recipe.rollout.engine!r}"
        worker = "an engine worker" if index is None else f"engine worker {index}"
        return PluginError(
            f"weight sync stalled: {worker} ({engine}) did not finish {method} within "
            f"{self.weight_timeout_s:g} s (rollout.update_weights_timeout_s); see that "
            "engine's log (is it alive, is its device busy?), or raise the timeout"
        )

    async def _weight_call(self, index: int, method: str, *args: Any) -> Any:
        try:
            return await asyncio.wait_for(
                self._call_alive(index, method, *args), self.weight_timeout_s
            )
        except TimeoutError:
            raise self._stalled(index, method) from None

    async def _weight_broadcast(
        self, method: str, *args: Any, indices: Sequence[int] | None
    ) -> list:
        targets = range(self.num_engines) if indices is None else indices
        return list(await asyncio.gather(*(self._weight_call(i, method, *args) for i in targets)))

    def wait_weights(self, future: concurrent.futures.Future, method: str) -> Any:
        """The result of a weight-update call started on the group's loop, waited for at most
        a little past the timeout: an engine that blocks the loop itself (so the timeout
        inside cannot fire) still ends in one line naming the call, never a hang."""
        try:
            return future.result(timeout=self.weight_timeout_s + WEIGHT_TIMEOUT_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise self._stalled(None, method) from None

    def begin_weight_update(
        self, version: int, weights: Sequence[WeightMeta], indices: Sequence[int] | None = None
    ) -> None:
        coroutine = self._weight_broadcast(
            "begin_weight_update", version, list(weights), indices=indices
        )
        self.wait_weights(self._thread.submit(coroutine), "begin_weight_update")

    def load_weights_async(
        self, bucket: Any, indices: Sequence[int] | None = None
    ) -> concurrent.futures.Future:
        """Start loading one bucket (a list of named tensors, or an object-store reference to
        one) into the engines; the future resolves when all have it. Wait for it with
        :meth:`wait_weights`."""
        return self._thread.submit(self._weight_broadcast("load_weights", bucket, indices=indices))

    def load_weights(self, bucket: Any, indices: Sequence[int] | None = None) -> None:
        self.wait_weights(self.load_weights_async(bucket, indices), "load_weights")

    def finish_weight_update(self, indices: Sequence[int] | None = None) -> None:
        coroutine = self._weight_broadcast("finish_weight_update", indices=indices)
        versions = self.wait_weights(self._thread.submit(coroutine), "finish_weight_update")
        if indices is None or len(indices) == self.num_engines:
            self.weight_version = int(versions[0])

    def weight_fingerprints(
        self, names: Sequence[str], indices: Sequence[int] | None = None
    ) -> list[dict[str, WeightFingerprint]]:
        """Each engine's :meth:`RolloutEngine.weight_fingerprints
        <plugrl.parts.rollout.RolloutEngine.weight_fingerprints>` of ``names``, in engine
        order, read back within the weight-update timeout."""
        coroutine = self._weight_broadcast("weight_fingerprints", list(names), indices=indices)
        return self.wait_weights(self._thread.submit(coroutine), "weight_fingerprints")

    def transport_receive(
        self, transport_name: str, sessions: Sequence[Any], indices: Sequence[int] | None = None
    ) -> concurrent.futures.Future:
        """Start the worker side of a weight transport in engines ``indices`` (engine
        ``indices[i]`` gets ``sessions[i]``); the future resolves when all are done."""
        targets = list(range(self.num_engines) if indices is None else indices)
        if len(sessions) != len(targets):
            raise ValueError(f"{len(sessions)} sessions for {len(targets)} engines")

        async def receive_all() -> list:
            return list(
                await asyncio.gather(
                    *(
                        self._call(i, "transport_receive", transport_name, session)
                        for i, session in zip(targets, sessions, strict=True)
                    )
                )
            )

        return self._thread.submit(receive_all())

    def bind_model(self, model: Any, version: int) -> None:
        """Let an in-process engine generate with the trainer's live ``model``."""
        raise RuntimeError(f"{type(self).__name__} cannot share a model: its engines are not here")

    def engine_pids(self) -> list[int]:
        """The process id of each engine worker."""
        return self._blocking(self._broadcast("pid", indices=None))

    # ---------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop the engines and the group's loop thread."""
        try:
            with contextlib.suppress(Exception):
                self._thread.submit(self._close_all()).result(timeout=60)
        finally:
            self._release()
            self._thread.stop()

    async def _close_all(self) -> None:
        await asyncio.gather(
            *(self._call(i, "close") for i in range(self.num_engines)), return_exceptions=True
        )

    def _release(self) -> None:
        """Free what the group holds outside its loop (Ray actors, placement)."""


class LocalEngineGroup(EngineGroup):
    """One engine in this process, served on the group's loop thread (``cluster: local``)."""

    in_process = True

    def __init__(
        self,
        recipe: Recipe,
        *,
        device_name: str,
        plugins: PluginManager,
        model_from_trainer: bool = False,
    ) -> None:
        self.worker = EngineWorker(recipe, device_name, model_from_trainer=model_from_trainer)
        super().__init__(recipe, 1, [])
        try:
            info = self._blocking(self.worker.start(plugins))
        except BaseException:
            self._thread.stop()
            raise
        self.capabilities = frozenset(Capability(c) for c in info["capabilities"])

    @property
    def engine(self) -> RolloutEngine:
        return self.worker._engine()

    async def _call(self, index: int, method: str, *args: Any) -> Any:
        return await getattr(self.worker, method)(*args)

    def bind_model(self, model: Any, version: int) -> None:
        self._blocking(self.worker.bind_model(model, version))
        self.weight_version = version


def _settle(future: concurrent.futures.Future, task: asyncio.Future) -> None:
    """Give ``future`` (of another thread) the outcome of ``task`` (of the loop)."""
    if future.done():  # the caller gave up on it
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


class RayEngineGroup(EngineGroup):
    """Engine actors placed by ``placement``: one engine per bundle, or with ``span`` > 1 one
    engine per ``span`` consecutive bundles of one device each (colocated engines of several
    devices, or engines larger than a node; see the module's docstring), on the first of them
    and seeing their devices of that node.

    ``spans`` lists the bundles of each engine; ``engine_spans`` where each engine's bundles
    are when they are on several nodes (``None`` for an engine of one node)."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        device_name: str,
        plugins: PluginManager,
        placement: RayPlacement,
        role: str = "rollout",
        owns_placement: bool = False,
        span: int = 1,
    ) -> None:
        from plugrl.cluster.ray_group import (
            ensure_ray,
            in_process_plugin_modules,
            log_spread,
            worker_env,
        )

        self.ray = ensure_ray(recipe.cluster)
        self.placement = placement
        self.role = role
        self.owns_placement = owns_placement
        self.device_name = device_name
        self.plugin_modules = in_process_plugin_modules(plugins)
        device_cls = plugins.registry("devices").load(device_name)
        self.env = worker_env(device_cls.worker_env("rollout"))
        self.spans = engine_spans(placement.world_size, span)
        self.envs = [self.env] * len(self.spans)
        self.engine_spans: list[EngineSpan | None] = [None] * len(self.spans)
        if span > 1:
            name = recipe.rollout.engine
            engine_cls = plugins.registry("rollout_engines").load(name)
            visible = device_cls.visible_devices_env
            for index, nodes in enumerate(span_nodes(placement, role, self.spans)):
                check_spans_nodes(name, engine_cls, index, nodes)
                # the engine's actor sees its own node's devices of the span
                self.envs[index] = span_env(self.env, visible, nodes[0][2])
                if len(nodes) > 1:
                    self.engine_spans[index] = self._engine_span(nodes, visible)
        # wrapped here, not decorated in its module (Ray pickles the class it is given)
        self.remote_worker = self.ray.remote(EngineWorker)
        super().__init__(recipe, len(self.spans), [])
        self.workers: list[Any] = [None] * self.num_engines
        try:
            infos = self._blocking(self._start_all())
        except BaseException:
            self._release()
            self._thread.stop()
            raise
        self.capabilities = frozenset(Capability(c) for c in infos[0]["capabilities"])
        log_spread(f"{role} engines", [tuple(info["node"]) for info in infos])
        for index, where in enumerate(self.engine_spans):
            if where is not None:
                logger.info(
                    "%s engine %d spans %d Ray nodes: %s",
                    role,
                    index,
                    len(where.nodes),
                    "; ".join(
                        f"bundles {','.join(map(str, node.bundles))} on node {node.node_id[:12]}"
                        for node in where.nodes
                    ),
                )
            ranks = infos[index].get("rank_nodes")
            if ranks and len(set(ranks)) > 1:
                logger.info(
                    "%s engine %d splits its model over %d Ray nodes: %s",
                    role,
                    index,
                    len(set(ranks)),
                    "; ".join(f"rank {r} on node {node[:12]}" for r, node in enumerate(ranks)),
                )

    def _engine_span(
        self, nodes: Sequence[tuple[str, list[int], list[str]]], visible: str | None
    ) -> EngineSpan:
        """What an engine over several nodes is told of them: each node's bundles, device
        ids, and the Ray options that put a worker of its own there."""
        return EngineSpan(
            nodes=tuple(
                SpanNode(
                    node_id=node,
                    bundles=tuple(held),
                    devices=tuple(ids),
                    actor_options={
                        **self.placement.actor_options(self.role, held[0]),
                        "runtime_env": {"env_vars": span_env(self.env, visible, ids)},
                    },
                )
                for node, held, ids in nodes
            ),
            placement_group=self.placement.placement_group,
            device_share=self.placement.devices_per_bundle * self.placement.share,
        )

    async def _start_all(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self._start_worker(i) for i in range(self.num_engines))))

    async def _start_worker(self, index: int) -> dict[str, Any]:
        options = self.placement.actor_options(self.role, self.spans[index][0])
        if self.engine_spans[index] is not None:
            # its workers take the devices' shares, this one's node's included
            options.pop("num_gpus", None)
            options.pop("resources", None)
        worker = self.remote_worker.options(
            **options,
            runtime_env={"env_vars": self.envs[index]},
            max_concurrency=max(1000, 4 * self.recipe.rollout.max_num_seqs),
        ).remote(
            self.recipe,
            self.device_name,
            index,
            self.plugin_modules,
            engine_span=self.engine_spans[index],
        )
        self.workers[index] = worker
        return await self._call(index, "start")

    async def _call(self, index: int, method: str, *args: Any) -> Any:
        from ray.exceptions import RayActorError, RayTaskError

        worker = self.workers[index]
        if worker is None:
            raise EngineDied(f"engine worker {index} is not running")
        try:
            return await getattr(worker, method).remote(*args)
        except RayActorError as exc:
            raise EngineDied(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, PlugrlError):
                raise cause from None
            raise

    async def _restart(self, index: int) -> None:
        old = self.workers[index]
        self.workers[index] = None
        if old is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(old)
        await self._start_worker(index)

    def _release(self) -> None:
        for worker in getattr(self, "workers", []):
            if worker is not None:
                with contextlib.suppress(Exception):
                    self.ray.kill(worker)
        self.workers = []
        if self.owns_placement:
            self.placement.close()


def engine_spans(bundles: int, span: int) -> list[list[int]]:
    """The bundles of each engine when each spans ``span`` consecutive ones of ``bundles``."""
    if span < 1 or bundles % span:
        raise ValueError(f"{bundles} bundles do not divide into engines of {span}")
    return [list(range(first, first + span)) for first in range(0, bundles, span)]


def span_nodes(
    placement: RayPlacement, role: str, spans: Sequence[Sequence[int]]
) -> list[list[tuple[str, list[int], list[str]]]]:
    """Each span's bundles grouped by the Ray node they sit on: ``(node id, bundles, device
    ids)`` per node, the node of the span's first bundle first (the engine's actor runs
    there), the others in the order the span reaches them."""
    bundles = [b for span in spans for b in span]
    where = dict(zip(bundles, placement.bundle_devices(role, bundles), strict=True))
    return [group_by_node(span, where) for span in spans]


def group_by_node(
    span: Sequence[int], where: dict[int, tuple[str, list[str]]]
) -> list[tuple[str, list[int], list[str]]]:
    """``span``'s bundles grouped by node (``where``: bundle -> its node and device ids), in
    the order the span reaches each node."""
    nodes: dict[str, tuple[list[int], list[str]]] = {}
    for bundle in span:
        node, devices = where[bundle]
        held, ids = nodes.setdefault(node, ([], []))
        held.append(bundle)
        ids.extend(devices)
    return [(node, held, ids) for node, (held, ids) in nodes.items()]


def check_spans_nodes(
    engine_name: str,
    engine_cls: type,
    index: int,
    nodes: Sequence[tuple[str, list[int], list[str]]],
) -> None:
    """One line when engine ``index``'s devices (``nodes``, from :func:`span_nodes`) are on
    several nodes and its class cannot run so (``RolloutEngine.spans_nodes``)."""
    if len(nodes) < 2 or getattr(engine_cls, "spans_nodes", False):
        return
    bundles = [b for _, held, _ in nodes for b in held]
    where = "; ".join(
        f"node {node[:12]}: "
        + (f"devices {','.join(ids)}" if ids else f"{len(held)} bundle(s) of no device ids")
        for node, held, ids in nodes
    )
    raise PluginError(
        f"the {engine_name} rollout engine cannot run over several Ray nodes, and engine "
        f"{index} spans {len(bundles)} devices (bundles {bundles[0]}..{bundles[-1]}) on "
        f"{len(nodes)} nodes ({where}); use an engine that can (vllm, hf), or engines of "
        "one node's devices: a rollout.tensor_model_parallel_size that divides the devices "
        "per node"
    )


def span_env(
    env: dict[str, str], visible_env: str | None, devices: Sequence[str]
) -> dict[str, str]:
    """The environment of an engine that sees ``devices`` (ids of one node's devices): ``env``
    with the device's ``visible_devices_env`` set to them, and Ray's variable that stops it
    narrowing that to the actor's own share. Unchanged where there are no ids (CPU)."""
    if not visible_env or not devices:
        return env
    return {
        **env,
        visible_env: ",".join(devices),
        f"RAY_EXPERIMENTAL_NOSET_{visible_env}": "1",
    }


# --------------------------------------------------------------------------------------------
# Making the group a recipe asks for
# --------------------------------------------------------------------------------------------


def engine_pool_size(recipe: Recipe) -> int:
    """Engines of a ``rollout.colocate: false`` run on Ray: its own devices over the devices
    one engine spans (that they divide is checked when the recipe is read)."""
    rollout = recipe.rollout
    return rollout.nnodes * rollout.n_gpus_per_node // rollout.tensor_model_parallel_size


def make_engine_group(
    recipe: Recipe,
    *,
    device_name: str,
    plugins: PluginManager,
    trainer_placement: RayPlacement | None = None,
    model_from_trainer: bool = False,
) -> EngineGroup:
    """The engines the recipe asks for: in this process for ``cluster: local``; on Ray, on
    the trainer's devices (``trainer_placement``, one engine per
    ``rollout.tensor_model_parallel_size`` devices) when ``rollout.colocate`` is true, else on
    a placement of their own."""
    if recipe.cluster.mode != "ray":
        return LocalEngineGroup(
            recipe,
            device_name=device_name,
            plugins=plugins,
            model_from_trainer=model_from_trainer,
        )
    from plugrl.cluster.ray_group import RayPlacement

    rollout = recipe.rollout
    if rollout.colocate:
        if trainer_placement is None:
            raise ValueError("colocated engines on Ray need the trainer's placement")
        # engine e on the devices of trainer ranks e*tp .. (e+1)*tp - 1 (the recipe check
        # makes tp divide the trainer's devices of a node)
        return RayEngineGroup(
            recipe,
            device_name=device_name,
            plugins=plugins,
            placement=trainer_placement,
            span=rollout.tensor_model_parallel_size,
        )
    device_cls = plugins.registry("devices").load(device_name)
    tp = rollout.tensor_model_parallel_size
    # an engine of one node's devices at most is one bundle of them; a larger one spans tp
    # bundles of one device, which Ray may put on several nodes
    per_bundle = tp if tp <= rollout.n_gpus_per_node else 1
    placement = RayPlacement(
        recipe.cluster,
        world_size=engine_pool_size(recipe) * tp // per_bundle,
        resource=device_cls.ray_resource,
        roles=["rollout"],
        devices_per_bundle=per_bundle,
        cpus_per_rank=1 if device_cls.ray_resource else per_bundle,
        resource_key="rollout.n_gpus_per_node",
    )
    try:
        return RayEngineGroup(
            recipe,
            device_name=device_name,
            plugins=plugins,
            placement=placement,
            owns_placement=True,
            span=tp // per_bundle,
        )
    except BaseException:
        placement.close()
        raise


def make_frozen_engine_group(
    recipe: Recipe,
    *,
    model: ModelConfig,
    rollout: RolloutConfig,
    device_name: str,
    plugins: PluginManager,
) -> EngineGroup:
    """Engines that serve a second model, one that does not train (an LLM judge): the run's
    ``recipe`` with ``model`` and ``rollout`` (that model's engine section, read with
    :func:`plugrl.recipe.read_section`) in place of its own. The engines load ``model.path``
    themselves and use its tokenizer; nothing connects them to the trainer, so they never
    receive weights. They never sit on the trainer's devices either: in this process for
    ``cluster: local``, on Ray on a placement of their own (``rollout.nnodes x
    rollout.n_gpus_per_node`` of that section). Close the group when done with it."""
    frozen = attrs.evolve(recipe, model=model, rollout=attrs.evolve(rollout, colocate=False))
    return make_engine_group(frozen, device_name=device_name, plugins=plugins)
