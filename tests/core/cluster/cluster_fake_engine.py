"""A plugin with a rollout engine that needs no model, to test engine groups and transports.

The ``counting`` engine emits one token per event-loop turn (after a short sleep, so requests
overlap and can be paused, aborted or killed mid-way). Token ``i`` of a sample is
``offset + (seed + i) % 97``, where ``seed`` comes from the request's seed and sample index and
``offset`` is the sum of the loaded weights: tokens show which weights produced them, and a
seeded request gives the same tokens on any engine. Registered in-process by the tests; Ray
workers import it by name.
"""

from __future__ import annotations

import asyncio
import os
from typing import ClassVar

import torch

import plugrl
from plugrl.errors import PluginError
from plugrl.parts.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    RolloutEngine,
    derive_seed,
)

PREPARED: list[tuple[str, str]] = []
STEP_SECONDS = 0.002


@plugrl.hookimpl
def register_rollout_engines(register):
    register("counting", "tests.core.cluster.cluster_fake_engine:CountingEngine")
    register("counting_plain", "tests.core.cluster.cluster_fake_engine:PlainEngine")
    register(
        "counting_guarded",
        "tests.core.cluster.cluster_fake_engine:CountingEngine",
        framework_modules=["json", "not_a_module_anywhere"],
    )


@plugrl.hookimpl
def prepare_rollout(device, engine, recipe):
    PREPARED.append((device, engine))
    if engine.startswith("counting"):
        return [f"counting patch for {device}"]
    return None


class CountingEngine(RolloutEngine):
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.STREAM,
            Capability.ABORT,
            Capability.PAUSE_KEEP,
            Capability.WEIGHT_UPDATE,
            Capability.SLEEP,
        }
    )

    def __init__(self, config, context):
        super().__init__(config, context)
        self.prepared_before_init = list(PREPARED)
        self.weights: dict[str, torch.Tensor] = {}
        self.offset = 0
        self._incoming: dict[str, torch.Tensor] | None = None
        self._announced: list = []
        self._next_version = 0
        self._aborted: set[str] = set()
        self._paused = False
        self._abort_on_pause = False
        self.sleeping = False
        self.events: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        """The most samples generating at once so far."""
        self.tokens_so_far: dict[str, int] = {}
        """Tokens generated so far, by request id (its samples together)."""

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        params = request.params
        samples = []
        for index in range(params.n):
            seed = derive_seed(params.seed if params.seed is not None else 0, index)
            samples.append(self._sample(request, index, seed))
        return list(await asyncio.gather(*samples))

    async def _sample(self, request: GenerationRequest, index: int, seed: int) -> Completion:
        tokens, versions = [], []
        reason = "length"
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            for position in range(request.params.max_tokens):
                await asyncio.sleep(STEP_SECONDS)
                while self._paused and not self._abort_on_pause:
                    await asyncio.sleep(STEP_SECONDS)
                if request.request_id in self._aborted or (self._paused and self._abort_on_pause):
                    reason = "aborted"
                    break
                tokens.append(self.offset + (seed + position) % 97)
                versions.append(self.weight_version)
                key = request.request_id
                self.tokens_so_far[key] = self.tokens_so_far.get(key, 0) + 1
        finally:
            self.in_flight -= 1
        return Completion(
            token_ids=tokens,
            log_probs=[-1.0] * len(tokens),
            finish_reason=reason,
            token_versions=versions,
            weight_version=self.weight_version,
            request_id=request.request_id,
            sample_index=index,
        )

    async def abort(self, request_ids):
        self._aborted.update(request_ids)

    async def pause(self, mode="keep"):
        self._paused = True
        self._abort_on_pause = mode == "abort"

    async def resume(self):
        self._paused = False
        self._abort_on_pause = False

    async def begin_weight_update(self, version, weights):
        self._incoming = {}
        self._announced = list(weights)
        self._next_version = version

    async def load_weights(self, bucket):
        if self._incoming is None:
            raise PluginError("load_weights before begin_weight_update")
        for name, tensor in bucket:
            self._incoming[name] = tensor.clone()

    async def finish_weight_update(self):
        assert self._incoming is not None
        missing = [meta.name for meta in self._announced if meta.name not in self._incoming]
        if missing:
            raise PluginError(f"weights missing: {', '.join(missing)}")
        self.weights, self._incoming = self._incoming, None
        self.offset = int(sum(float(t.sum()) for t in self.weights.values()))
        self.weight_version = self._next_version

    async def sleep(self, level=1):
        self.sleeping = True
        self.events.append(f"sleep {level}")

    async def wake_up(self, tags=None):
        self.sleeping = False
        self.events.append(f"wake {tags}")


class PlainEngine(CountingEngine):
    """Samples and nothing else."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()


def pid() -> int:
    return os.getpid()
