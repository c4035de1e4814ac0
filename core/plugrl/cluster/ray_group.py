"""N ranks of a role as Ray actors, placed by the device's Ray resource."""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugrl.cluster.base import WorkerGroup
from plugrl.cluster.worker import BackendWorker
from plugrl.errors import PlugrlError, RecipeError
from plugrl.parts.backend import DistInfo
from plugrl.plugins import PluginManager, get_plugin_manager

if TYPE_CHECKING:
    from plugrl.parts.backend import Role
    from plugrl.recipe import ClusterConfig, Recipe

# Environment a worker needs to see the same plugins and stay offline like the driver.
FORWARDED_ENV_PREFIXES = ("PLUGRL_", "HF_", "TRANSFORMERS_")


def ensure_ray(cluster: ClusterConfig) -> types.ModuleType:
    """Ray, initialised: joined at ``cluster.address``, or a local Ray started for the run
    (``cluster.num_cpus`` CPUs, all when unset). An already initialised Ray is reused."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if not ray.is_initialized():
        if cluster.address:
            ray.init(address=cluster.address, log_to_driver=True)
        else:
            ray.init(num_cpus=cluster.num_cpus, include_dashboard=False)
    return ray


def in_process_plugin_modules(plugins: PluginManager) -> list[str]:
    """Import names of the plugin modules registered in this process rather than found
    through entry points; workers register them too."""
    names = []
    for name, plugin in plugins.pm.list_name_plugin():
        source = plugins.sources.get(name)
        if source is None or source.entry_point is not None:
            continue
        if isinstance(plugin, types.ModuleType) and plugin.__name__ != "__main__":
            names.append(plugin.__name__)
    return names


class RayWorkerGroup(WorkerGroup):
    """``world_size`` ranks of ``role``, one Ray actor each, gang-placed in a placement group.

    Each rank takes one unit of the device's Ray resource (``Device.ray_resource``: ``GPU``,
    ``NPU``...) and ``num_cpus_per_rank`` CPUs; a CPU-only device places by CPUs alone. Rank 0
    hosts the process group's store; every rank joins it with ``Device.dist_backend``, then
    builds the backend after the ``prepare_backend`` hook ran in its process. Batches and the
    objective travel through Ray's object store.
    """

    def __init__(
        self,
        recipe: Recipe,
        role: Role,
        *,
        world_size: int,
        device_name: str,
        plugins: PluginManager | None = None,
        num_cpus_per_rank: float = 1,
        placement_timeout_s: float = 300,
    ) -> None:
        if world_size <= 0:
            raise ValueError(f"world_size must be > 0, got {world_size}")
        self.recipe = recipe
        self.role = role
        self.world_size = world_size
        self.ray = ray = ensure_ray(recipe.cluster)
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plugins = plugins or get_plugin_manager()
        device_cls = plugins.registry("devices").load(device_name)
        resource = device_cls.ray_resource
        bundle: dict[str, float] = {"CPU": num_cpus_per_rank}
        if resource:
            bundle[resource] = 1
        self._check_capacity(bundle, world_size)
        self.placement_group = placement_group([dict(bundle)] * world_size, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=placement_timeout_s)
        if not ready:
            remove_placement_group(self.placement_group)
            raise RecipeError(
                f"Ray could not place {world_size} {role} ranks of {bundle} within "
                f"{placement_timeout_s:.0f} s (other work holds the resources?); free them or "
                "use fewer ranks",
                key="trainer.n_gpus_per_node",
            )
        options: dict[str, Any] = {"num_cpus": num_cpus_per_rank}
        if resource == "GPU":
            options["num_gpus"] = 1
        elif resource:
            options["resources"] = {resource: 1}
        env = {
            key: value
            for key, value in os.environ.items()
            if key.startswith(FORWARDED_ENV_PREFIXES)
        }
        # wrapped here, not decorated in its module: see plugrl.cluster.worker
        remote_worker = ray.remote(BackendWorker)
        modules = in_process_plugin_modules(plugins)
        self.workers = [
            remote_worker.options(
                **options,
                runtime_env={"env_vars": env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.placement_group, placement_group_bundle_index=rank
                ),
            ).remote(
                recipe,
                role,
                device_name,
                DistInfo(rank=rank, world_size=world_size, local_rank=0),
                modules,
            )
            for rank in range(world_size)
        ]
        try:
            self._start()
        except BaseException:
            self._release()
            raise

    def _check_capacity(self, bundle: dict[str, float], world_size: int) -> None:
        total = self.ray.cluster_resources()
        for name, amount in bundle.items():
            have = total.get(name, 0)
            if have < amount * world_size:
                raise RecipeError(
                    f"{world_size} {self.role} ranks need {amount * world_size:g} {name} but "
                    f"the Ray cluster has {have:g}; use fewer ranks or a bigger cluster "
                    "(cluster.num_cpus for a local Ray)",
                    key="trainer.n_gpus_per_node",
                )

    def _start(self) -> None:
        master_ip, port = self._get([self.workers[0].master_address.remote()])[0]
        ips = self._get([worker.node_ip.remote() for worker in self.workers])
        # one machine: loopback, which works even where the node address is not routable
        master = "127.0.0.1" if all(ip == master_ip for ip in ips) else master_ip
        ranks = self._get([worker.start.remote(master, port) for worker in self.workers])
        self.dp_ranks = [int(dp_rank) for dp_rank, _ in ranks]

    def _get(self, refs: Sequence[Any]) -> list:
        """Results in order; the first failure is raised as soon as it happens (the other
        ranks may be stuck waiting for the failed one), a plugrl error as itself."""
        ray = self.ray
        position = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                results[position[ready[0]]] = ray.get(ready[0])
            except Exception as exc:
                self._collect_failures(pending)
                raise self._driver_error(exc) from None
        return results

    def _collect_failures(self, pending: list[Any]) -> None:
        """Fetch what the other ranks already returned: usually the same error, which Ray would
        otherwise report again as unhandled."""
        if not pending:
            return
        done, _ = self.ray.wait(pending, num_returns=len(pending), timeout=1.0)
        for ref in done:
            with contextlib.suppress(Exception):
                self.ray.get(ref)

    def _driver_error(self, exc: Exception) -> BaseException:
        from ray.exceptions import RayActorError, RayTaskError

        if isinstance(exc, RayTaskError):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, PlugrlError):
                return cause
            return exc
        if isinstance(exc, RayActorError):
            return RuntimeError(f"a {self.role} rank's Ray actor died ({exc}); see the worker log")
        return exc

    def _put_all(self, shards: list[Any]) -> list[Any]:
        return [self.ray.put(shard) for shard in shards]

    def _call_ranks(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        refs = [
            worker.call.remote(method, *args, **kwargs)
            for worker, args in zip(self.workers, per_rank_args, strict=True)
        ]
        return self._get(refs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()

    def _release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for worker in getattr(self, "workers", []):
            self.ray.kill(worker)
        self.workers = []
        if getattr(self, "placement_group", None) is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None
