"""N ranks of a role as Ray actors, placed by the device's Ray resource."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.cluster.base import WorkerGroup
from plugrl.cluster.worker import BackendWorker
from plugrl.errors import PluginError, PlugrlError, RecipeError
from plugrl.parts.context import DistInfo
from plugrl.plugin.manager import PluginManager

if TYPE_CHECKING:
    from plugrl.parts.backend import Role
    from plugrl.recipe import ClusterConfig, Recipe

logger = logging.getLogger("plugrl.cluster")

# Environment a worker needs to see the same plugins and stay offline like the driver.
FORWARDED_ENV_PREFIXES = ("PLUGRL_", "HF_", "TRANSFORMERS_")


def worker_env(device_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker: the device's settings for its kind of worker
    (:meth:`Device.worker_env <plugrl.parts.device.Device.worker_env>`), under the driver's
    own ``PLUGRL_*``, ``HF_*`` and ``TRANSFORMERS_*`` variables and whatever of the device's
    variables the user set (the user's values win)."""
    env = dict(device_env)
    for key, value in os.environ.items():
        if key.startswith(FORWARDED_ENV_PREFIXES) or key in env:
            env[key] = value
    return env


RAY_INSTALL = "pip install 'plugrl[ray]'"
"""What installs Ray for plugrl (the ``ray`` extra)."""


def ray_installed() -> bool:
    """Whether ``import ray`` can work here (checked without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def missing_ray_message(needs: Sequence[str]) -> str:
    """One line: what needs Ray (``needs``: settings such as ``cluster.mode=ray``) and the
    command that installs it."""
    return (
        f"{' and '.join(needs)} {'needs' if len(needs) == 1 else 'need'} Ray, which is not "
        f"installed here: {RAY_INSTALL}"
    )


def import_ray(needed_by: str) -> types.ModuleType:
    """``import ray``, or a :class:`PluginError` of one line naming ``needed_by`` (what needs
    it, ``cluster.mode=ray``) and the install command."""
    try:
        import ray
    except ImportError:
        raise PluginError(missing_ray_message([needed_by])) from None
    return ray


def ray_needs(recipe: Recipe) -> list[str]:
    """The settings of ``recipe`` that need Ray, as ``key=value``: the Ray cluster, the
    object-store weight transport, scoring or a reward model on Ray actors."""
    needs = []
    if recipe.cluster.mode == "ray":
        needs.append("cluster.mode=ray")
    if recipe.rollout.weight_transport == "object_store":
        needs.append("rollout.weight_transport=object_store")
    # the parallel reward manager's option (its Ray actor pool); other managers lack it
    if getattr(recipe.reward, "backend", None) == "ray":
        needs.append("reward.backend=ray")
    # the reward_model manager's option: the reward model on Ray actors
    if getattr(recipe.reward, "placement", None) == "ray":
        needs.append("reward.placement=ray")
    return needs


def check_ray_installed(recipe: Recipe) -> None:
    """A :class:`PluginError` of one line when the recipe needs Ray (:func:`ray_needs`) and
    Ray is not installed. Runs call it at start-up, before building anything, so that such a
    run stops with the settings to change and the install command, not with an import
    traceback halfway through its start."""
    needs = ray_needs(recipe)
    if needs and not ray_installed():
        raise PluginError(missing_ray_message(needs))


def ensure_ray(cluster: ClusterConfig) -> types.ModuleType:
    """Ray, initialised: joined at ``cluster.address``, or a local Ray started for the run
    (``cluster.num_cpus`` CPUs, all when unset). An already initialised Ray is reused."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = import_ray("cluster.mode=ray")

    if not ray.is_initialized():
        if cluster.address:
            init_ray(address=cluster.address, log_to_driver=True)
        else:
            init_ray(num_cpus=cluster.num_cpus, include_dashboard=False)
    return ray


def check_cluster_paths(recipe: Recipe, plugins: PluginManager, run_dir: Path) -> None:
    """On a Ray cluster of several nodes, check that the others see the recipe's paths and
    the run folder ``run_dir`` (:func:`plugrl.cluster.nodes.check_nodes`)."""
    from plugrl.cluster.nodes import check_nodes

    asked = check_nodes(recipe, plugins, run_dir, ensure_ray(recipe.cluster))
    if asked:
        logger.info("the run's files and run folder are seen by the other %d Ray node(s)", asked)


def init_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)``, keeping the SIGTERM handler the process had.

    ``ray.init`` replaces that handler, in the driver's main thread, with one that calls
    ``sys.exit``, and the driver's core worker puts its failure-signal handler in front of it:
    on SIGTERM that handler prints a stack trace, calls ``sys.exit``'s, and about 3 s later
    aborts the process (status 134) wherever its shutdown is. A run stopped that way skips its
    interrupt path (the ``plugrl`` command makes SIGTERM stop a run as Ctrl-C does) and dies
    while closing its actors. Putting the process's handler back removes both; Ray still
    shuts down at exit. A process without a handler of its own (SIGTERM's default) keeps
    Ray's.
    """
    import ray

    before = signal.getsignal(signal.SIGTERM)
    ray.init(**kwargs)
    if (
        before not in (None, signal.SIG_DFL)
        and threading.current_thread() is threading.main_thread()
    ):
        signal.signal(signal.SIGTERM, before)


def log_spread(what: str, nodes: Sequence[tuple[str, str | None]]) -> None:
    """Log which of ``what`` (ranks, engines) run on which node, when they span several:
    ``nodes`` is each one's (address, Ray node id)."""
    by_node: dict[tuple[str, str | None], list[int]] = {}
    for index, node in enumerate(nodes):
        by_node.setdefault((node[0], node[1]), []).append(index)
    if len(by_node) < 2:
        return
    logger.info(
        "%s on %d Ray nodes: %s",
        what,
        len(by_node),
        "; ".join(
            f"{', '.join(map(str, indices))} on node {(node_id or '?')[:12]} ({ip})"
            for (ip, node_id), indices in by_node.items()
        ),
    )


def actor_death_message(who: str, exc: BaseException) -> str:
    """One line for a Ray actor that died, instead of Ray's many-line report."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next(
        (line for line in lines if "exit" in line.lower() or "killed" in line.lower()),
        lines[0] if lines else type(exc).__name__,
    )
    return (
        f"{who}'s Ray actor died ({reason[:200]}); its output is in Ray's worker logs "
        "(`ray logs` lists them), often an out-of-memory kill"
    )


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


class RayPlacement:
    """Where the ranks of a run's roles live on a Ray cluster.

    A placement group of ``world_size`` bundles, each ``devices_per_bundle`` devices (the
    device's Ray resource, ``Device.ray_resource``; none on CPU) and ``cpus_per_rank`` CPUs.
    Rank ``i`` of every role sharing the placement goes to bundle ``i`` and takes an equal share
    of it: the actor, reference and critic ranks (and colocated engines) share the devices, as
    verl colocates them, instead of each role asking for devices of its own, and the ranks of
    one role are always on different devices. Engines spanning several devices get bundles of
    several (``devices_per_bundle``).
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        *,
        world_size: int,
        resource: str | None,
        roles: Sequence[str],
        cpus_per_rank: float = 1,
        timeout_s: float = 300,
        devices_per_bundle: int = 1,
        resource_key: str = "trainer.n_gpus_per_node",
    ) -> None:
        if world_size <= 0:
            raise ValueError(f"world_size must be > 0, got {world_size}")
        if not roles:
            raise ValueError("a placement needs at least one role")
        self.ray = ray = ensure_ray(cluster)
        from ray.util.placement_group import placement_group, remove_placement_group

        self.world_size = world_size
        self.resource = resource
        self.roles = list(roles)
        self.cpus_per_rank = cpus_per_rank
        self.devices_per_bundle = devices_per_bundle
        self.resource_key = resource_key
        self.share = 1.0 / len(self.roles)
        bundle: dict[str, float] = {"CPU": cpus_per_rank}
        if resource:
            bundle[resource] = devices_per_bundle
        label = "/".join(self.roles)
        self._check_capacity(bundle, label)
        self.placement_group: Any = placement_group([dict(bundle)] * world_size, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.placement_group)
            self.placement_group = None
            raise RecipeError(
                f"Ray could not place {world_size} {label} ranks of {bundle} within "
                f"{timeout_s:.0f} s (other work holds the resources?); free them or "
                "use fewer ranks",
                key=self.resource_key,
            )

    def _check_capacity(self, bundle: dict[str, float], label: str) -> None:
        total = self.ray.cluster_resources()
        for name, amount in bundle.items():
            have = total.get(name, 0)
            if have < amount * self.world_size:
                raise RecipeError(
                    f"{self.world_size} {label} ranks need {amount * self.world_size:g} {name} "
                    f"but the Ray cluster has {have:g}; use fewer ranks or a bigger cluster "
                    "(cluster.num_cpus for a local Ray)",
                    key=self.resource_key,
                )

    def actor_options(self, role: str, rank: int) -> dict[str, Any]:
        """Ray actor options that put ``rank`` of ``role`` on its share of bundle ``rank``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if role not in self.roles:
            raise ValueError(f"this placement is for {', '.join(self.roles)}, not {role}")
        if self.placement_group is None:
            raise RuntimeError("this placement was released")
        options: dict[str, Any] = {
            "num_cpus": self.cpus_per_rank * self.share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=rank
            ),
        }
        devices = self.devices_per_bundle * self.share
        if self.resource == "GPU":
            options["num_gpus"] = devices
        elif self.resource:
            options["resources"] = {self.resource: devices}
        return options

    def bundle_devices(self, role: str, bundles: Sequence[int]) -> list[tuple[str, list[str]]]:
        """Where each of ``bundles`` is: its Ray node id and the ids of the devices of its
        resource (as ``CUDA_VISIBLE_DEVICES`` names them; none on CPU). Asked by a short task
        on ``role``'s share of each bundle, so call it before ``role``'s actors take it."""
        resource = self.resource  # the task must not carry the placement with it

        def where() -> tuple[str, list[str]]:
            import ray

            context = ray.get_runtime_context()
            ids = context.get_accelerator_ids().get(resource, []) if resource else []
            return context.get_node_id(), [str(i) for i in ids]

        probe = self.ray.remote(where)
        refs = [probe.options(**self.actor_options(role, b)).remote() for b in bundles]
        return self.ray.get(refs)

    def close(self) -> None:
        """Give the bundles back (after the roles' actors are gone)."""
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None


class RayWorkerGroup(WorkerGroup):
    """``world_size`` ranks of ``role``, one Ray actor each, gang-placed by a
    :class:`RayPlacement`: a shared one (roles of one run share devices), or one of its own
    where each rank takes a whole device and ``num_cpus_per_rank`` CPUs.

    Rank 0 hosts the process group's store; every rank joins it with ``Device.dist_backend``,
    then builds the backend after the ``prepare_backend`` hook ran in its process. Batches and
    the objective travel through Ray's object store.
    """

    def __init__(
        self,
        recipe: Recipe,
        role: Role,
        *,
        world_size: int,
        device_name: str,
        plugins: PluginManager,
        num_cpus_per_rank: float = 1,
        placement_timeout_s: float = 300,
        placement: RayPlacement | None = None,
    ) -> None:
        if world_size <= 0:
            raise ValueError(f"world_size must be > 0, got {world_size}")
        self.recipe = recipe
        self.role = role
        self.world_size = world_size
        self.ray = ray = ensure_ray(recipe.cluster)
        self._owns_placement = placement is None
        if placement is None:
            resource = plugins.registry("devices").load(device_name).ray_resource
            placement = RayPlacement(
                recipe.cluster,
                world_size=world_size,
                resource=resource,
                roles=[role],
                cpus_per_rank=num_cpus_per_rank,
                timeout_s=placement_timeout_s,
            )
        elif placement.world_size != world_size:
            raise ValueError(
                f"a placement of {placement.world_size} bundles cannot host {world_size} ranks"
            )
        self.placement = placement
        env = worker_env(plugins.registry("devices").load(device_name).worker_env("trainer"))
        # wrapped here, not decorated in its module: see plugrl.cluster.worker
        remote_worker = ray.remote(BackendWorker)
        modules = in_process_plugin_modules(plugins)
        self.workers = [
            remote_worker.options(
                **placement.actor_options(role, rank), runtime_env={"env_vars": env}
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

    def _start(self) -> None:
        master_ip, port = self._get([self.workers[0].master_address.remote()])[0]
        nodes = self._get([worker.node.remote() for worker in self.workers])
        ips = [ip for ip, _ in nodes]
        self.node_ids: list[str | None] = [node for _, node in nodes]
        log_spread(f"{self.role} ranks", nodes)
        # one machine: loopback, which works even where the node address is not routable
        master = "127.0.0.1" if all(ip == master_ip for ip in ips) else master_ip
        ranks = self._get([worker.start.remote(master, port) for worker in self.workers])
        self.dp_ranks = [int(dp_rank) for dp_rank, _, _ in ranks]
        self.output_ranks = [bool(holds) for _, _, holds in ranks]
        self._check_output_ranks()

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
            return PluginError(actor_death_message(f"a {self.role} rank", exc))
        return exc

    def _put_all(self, shards: list[Any]) -> list[Any]:
        return [self.ray.put(shard) for shard in shards]

    def _call_workers(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        refs = [
            getattr(worker, method).remote(*args, **kwargs)
            for worker, args in zip(self.workers, per_rank_args, strict=True)
        ]
        return self._get(refs)

    def stream_weight_buckets(self, bucket_bytes: int) -> Iterator[Any]:
        # every rank runs its generator at once (they gather together); each bucket a rank
        # yields is put in the object store by that rank, and only its reference comes here
        streams = [
            worker.stream_weight_buckets.options(num_returns="streaming").remote(bucket_bytes)
            for worker in self.workers
        ]
        try:
            for stream in streams:
                yield from stream
        except Exception as exc:
            raise self._driver_error(exc) from None

    def close(self) -> None:
        from ray.exceptions import RayActorError

        alive = []
        for worker in self.workers:
            try:
                self.ray.get(worker.pid.remote(), timeout=30)
                alive.append(worker)
            except (RayActorError, self.ray.exceptions.GetTimeoutError):
                pass  # a rank that died has nothing left to release
        try:
            if len(alive) == len(self.workers):
                super().close()
        finally:
            self._release()

    def _release(self) -> None:
        for worker in getattr(self, "workers", []):
            self.ray.kill(worker)
        self.workers = []
        if self._owns_placement:
            self.placement.close()
