"""Transports that stream the trainer's weight buckets through the driver's hands by reference:
the worker group yields each bucket (a list of tensors in one process, an object-store
reference on Ray) and the engine group loads it into every engine, a few buckets in flight."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugrl.parts.transport import WeightTransport, weight_sync_metrics

if TYPE_CHECKING:
    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.engines import EngineGroup

# buckets being loaded while the trainer makes the next ones: enough to overlap the two,
# few enough that the buckets in flight stay a small part of the model
BUCKETS_IN_FLIGHT = 2


class _BucketStream(WeightTransport):
    def push(
        self,
        trainer: WorkerGroup,
        engines: EngineGroup,
        version: int,
        *,
        engine_indices: Sequence[int] | None = None,
    ) -> dict[str, float]:
        start = time.perf_counter()
        weights = trainer.weight_metadata()
        engines.begin_weight_update(version, weights, engine_indices)
        loading: deque[Any] = deque()
        for bucket in trainer.stream_weight_buckets(self.bucket_bytes):
            loading.append(engines.load_weights_async(bucket, engine_indices))
            if len(loading) > BUCKETS_IN_FLIGHT:
                engines.wait_weights(loading.popleft(), "load_weights")
        while loading:
            engines.wait_weights(loading.popleft(), "load_weights")
        engines.finish_weight_update(engine_indices)
        seconds = time.perf_counter() - start
        megabytes = sum(weight.nbytes for weight in weights) / 2**20
        return weight_sync_metrics(megabytes, seconds)


class LocalTransport(_BucketStream):
    """The trainer rank and the engine share this process: buckets are the tensors."""

    @classmethod
    def unusable_reason(cls, trainer: WorkerGroup, engines: EngineGroup) -> str | None:
        if trainer.in_process and engines.in_process:
            return None
        return "it needs the trainer and the engine in one process (cluster: local)"


class ObjectStoreTransport(_BucketStream):
    """Each bucket is put in Ray's object store once, by the trainer rank that made it; every
    engine worker fetches it (from shared memory on the same node). The driver passes
    references only."""

    @classmethod
    def unusable_reason(cls, trainer: WorkerGroup, engines: EngineGroup) -> str | None:
        if trainer.in_process or engines.in_process:
            return "it needs the trainer and the engines in Ray actors (cluster: ray)"
        return None
