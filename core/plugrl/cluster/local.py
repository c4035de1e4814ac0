"""One rank in the driver process: the worker is an ordinary object, calls are calls."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from plugrl.cluster.base import WorkerGroup
from plugrl.cluster.worker import BackendWorker
from plugrl.parts.context import DistInfo
from plugrl.plugin.manager import PluginManager

if TYPE_CHECKING:
    from plugrl.parts.backend import Role, TrainingBackend
    from plugrl.recipe import Recipe


class LocalWorkerGroup(WorkerGroup):
    """A single rank of ``role`` living in this process (``cluster: local``).

    Its process group is a single-rank one, so the backend runs the same collective code as on
    many ranks; the live model can be shared with an in-process rollout engine.
    """

    def __init__(
        self,
        recipe: Recipe,
        role: Role,
        *,
        device_name: str,
        plugins: PluginManager,
    ) -> None:
        self.recipe = recipe
        self.role = role
        self.world_size = 1
        self.in_process = True
        self.worker = BackendWorker(recipe, role, device_name, DistInfo())
        dp_rank, _, holds_outputs = self.worker.start(plugins=plugins)
        self.dp_ranks = [dp_rank]
        self.output_ranks = [bool(holds_outputs)]
        self._check_output_ranks()

    @property
    def backend(self) -> TrainingBackend:
        """The backend object itself."""
        assert self.worker.backend is not None
        return self.worker.backend

    def _call_workers(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        (args,) = per_rank_args
        return [getattr(self.worker, method)(*args, **kwargs)]

    def stream_weight_buckets(self, bucket_bytes: int) -> Iterator[Any]:
        return self.worker.stream_weight_buckets(bucket_bytes)

    def rollout_model(self) -> Any:
        return self.backend.rollout_model()
