"""Rollout engines with a planted weight-sync fault, for the tests of the weight-sync checks:
the ``hf`` engine, made to receive weights through a transport (it cannot share the trainer's
model), that keeps its old weights, skips one tensor, or stalls in a transfer, while telling
the caller every weight arrived."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

import plugrl
from plugrl.api.rollout import Capability
from plugrl_hf.engine import HFRolloutEngine

SKIPPED_WEIGHT = "model.layers.0.mlp.down_proj.weight"
"""The weight :class:`SkippingEngine` leaves as it was."""


class TransportedEngine(HFRolloutEngine):
    """The hf engine with weights of its own, updated through the weight transport."""

    capabilities = HFRolloutEngine.capabilities - {Capability.SHARE_MODEL}


class StaleEngine(TransportedEngine):
    """Accepts every bucket and keeps the weights it started with."""

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        update = self._update
        assert update is not None
        for name, _ in bucket:
            update.received.add(update.storages[name])


class SkippingEngine(TransportedEngine):
    """Loads every weight except :data:`SKIPPED_WEIGHT`, which it claims it loaded."""

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        update = self._update
        assert update is not None
        await super().load_weights([(n, t) for n, t in bucket if n != SKIPPED_WEIGHT])
        if any(name == SKIPPED_WEIGHT for name, _ in bucket):
            update.received.add(update.storages[SKIPPED_WEIGHT])


class StallingEngine(TransportedEngine):
    """Stalls in the first bucket of every update after the first (the one at start-up)."""

    updates = 0

    async def begin_weight_update(self, version, weights) -> None:
        type(self).updates += 1
        await super().begin_weight_update(version, weights)

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        if type(self).updates > 1:
            await asyncio.sleep(3600)
        await super().load_weights(bucket)


class FaultyEngines:
    """Registers the engines above as ``hf-transported``, ``hf-stale``, ``hf-skipping`` and
    ``hf-stalling``."""

    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        for name, cls in (
            ("hf-transported", "TransportedEngine"),
            ("hf-stale", "StaleEngine"),
            ("hf-skipping", "SkippingEngine"),
            ("hf-stalling", "StallingEngine"),
        ):
            register(
                name,
                f"tests.weight_sync_faults:{cls}",
                config="plugrl_hf.config:HFRolloutConfig",
                description="the hf engine with a planted weight-sync fault (tests)",
            )
