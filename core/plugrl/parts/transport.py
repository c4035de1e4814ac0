"""Weight transports: how a training backend's weights reach the engine workers.

The trainer's output rank yields its weights in buckets (:meth:`TrainingBackend.weight_buckets
<plugrl.parts.backend.TrainingBackend.weight_buckets>`); a transport carries each bucket to
every engine worker, which loads it between :meth:`~plugrl.parts.rollout.RolloutEngine.
begin_weight_update` and :meth:`~plugrl.parts.rollout.RolloutEngine.finish_weight_update`. The
driver orchestrates but never holds the model.

Built-in transports (``rollout.weight_transport``): ``local`` (trainer and engine in one
process: the tensors are handed over), ``object_store`` (Ray's object store: each bucket is put
once by the output rank and fetched by every engine worker) and ``collective`` (a process group
of the output rank and the engine workers, on the device's collective backend: nccl, hccl, or
gloo on CPU). An engine plugin with a faster route of its own registers it with the
``register_weight_transports`` hook.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.engines import EngineGroup
    from plugrl.parts.backend import TrainingBackend
    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import RolloutConfig, RolloutEngine


def weight_sync_metrics(megabytes: float, seconds: float) -> dict[str, float]:
    """What a push reports: ``perf/weight_sync_megabytes`` (per engine) and
    ``perf/weight_sync_megabytes_per_s``; the time is the step's ``timing_s/update_weights``."""
    return {
        "perf/weight_sync_megabytes": megabytes,
        "perf/weight_sync_megabytes_per_s": megabytes / max(seconds, 1e-9),
    }


class WeightTransport(ABC):
    """Moves the trainer's current weights to engine workers.

    Built in the driver as ``Transport(config, context)``: ``config`` is the ``rollout``
    section (``update_weights_bucket_megabytes``), ``context.device`` the run's device.
    A transport that needs code in the worker processes puts it in :meth:`send` (run in every
    rank of the trainer's worker group) and :meth:`receive` (run in every engine worker); the
    worker groups call them by the transport's registered name, so the class is imported in
    those processes from their own registry.
    """

    def __init__(self, config: RolloutConfig, context: PartContext) -> None:
        self.config = config
        self.context = context

    @property
    def bucket_bytes(self) -> int:
        return self.config.update_weights_bucket_megabytes * 1024 * 1024

    @classmethod
    def unusable_reason(cls, trainer: WorkerGroup, engines: EngineGroup) -> str | None:
        """Why this transport cannot connect ``trainer`` and ``engines`` (``None`` if it
        can); ``rollout.weight_transport=auto`` takes the first built-in that can."""
        return None

    @abstractmethod
    def push(
        self,
        trainer: WorkerGroup,
        engines: EngineGroup,
        version: int,
        *,
        engine_indices: Sequence[int] | None = None,
    ) -> dict[str, float]:
        """Give the engine workers ``engine_indices`` (all when ``None``) the trainer's current
        weights as ``version``: announce them (``begin_weight_update``), deliver every bucket,
        and ``finish_weight_update``. Blocks until every engine holds them. Returns
        :func:`weight_sync_metrics`."""

    def send(self, backend: TrainingBackend, session: Any) -> Any:
        """Worker side, in every trainer rank: take part in a transfer that :meth:`push`
        started (``session`` is what push handed the worker group)."""
        raise NotImplementedError(f"{type(self).__name__} sends nothing from the trainer ranks")

    async def receive(self, engine: RolloutEngine, session: Any) -> Any:
        """Worker side, in every engine worker: receive a transfer and load it into
        ``engine``."""
        raise NotImplementedError(f"{type(self).__name__} receives nothing in engine workers")
