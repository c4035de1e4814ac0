"""What runs where a backend rank lives: build the backend and call its methods.

:class:`BackendWorker` is a plain class so that it can be hosted in-process
(:class:`~plugrl.cluster.local.LocalWorkerGroup`) or wrapped as a Ray actor at run time
(:class:`~plugrl.cluster.ray_group.RayWorkerGroup`). It stays undecorated and imports torch
only inside the functions it calls: Ray pickles the class it is given, and a class whose
methods reach torch's globals drags unpicklable modules along.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from plugrl.cluster.distributed import ensure_process_group, free_port, init_process_group
from plugrl.errors import PluginError
from plugrl.parts.context import DistInfo, PartContext
from plugrl.plugin.manager import PluginManager, get_plugin_manager

if TYPE_CHECKING:
    from plugrl.parts.backend import Role, TrainingBackend
    from plugrl.parts.device import Device
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.cluster")

_PREPARE_HOOKS = {"training_backends": "prepare_backend", "rollout_engines": "prepare_rollout"}


def prepare_once(
    plugins: PluginManager, kind: str, device_name: str, part_name: str, recipe: Recipe
) -> list[str]:
    """Run ``prepare_backend`` (``kind="training_backends"``) or ``prepare_rollout``
    (``"rollout_engines"``) the first time this process builds ``part_name`` on
    ``device_name``, before the part's module is imported; log what each plugin patched.

    Refuses with one line when a framework module the part registered
    (``framework_modules``) was imported first: a patch applied after the import would not
    take, and the run would silently go without it.
    """
    key = (kind, device_name, part_name)
    if key in plugins.prepared:
        return plugins.prepared[key]
    hook_name = _PREPARE_HOOKS[kind]
    entry = plugins.registry(kind).get(part_name)
    early = sorted(module for module in entry.framework_modules if module in sys.modules)
    if early:
        raise PluginError(
            f"{', '.join(early)} was imported in this process before {hook_name} ran for "
            f"{device_name} + {part_name}, so patches that must come first (MindSpeed on npu, "
            f"for one) would not apply; do not import {early[0]} before the run builds its "
            "parts (check the reward function's and other plugins' module imports)"
        )
    arguments = {
        "device": device_name,
        "backend" if kind == "training_backends" else "engine": part_name,
        "recipe": recipe,
    }
    patched: list[str] = []
    # one implementation at a time, in pluggy's call order, to know whose patches they are
    for impl in reversed(getattr(plugins.hook, hook_name).get_hookimpls()):
        result = impl.function(*(arguments[name] for name in impl.argnames))
        for line in result or []:
            logger.info(
                "%s(%s, %s) by %s: %s", hook_name, device_name, part_name, impl.plugin_name, line
            )
            patched.append(f"{impl.plugin_name}: {line}")
    plugins.prepared[key] = patched
    return patched


def prepare_backend_once(
    plugins: PluginManager, device_name: str, backend_name: str, recipe: Recipe
) -> list[str]:
    """:func:`prepare_once` for a training backend."""
    return prepare_once(plugins, "training_backends", device_name, backend_name, recipe)


def build_device(plugins: PluginManager, device_name: str, recipe: Recipe) -> Device:
    """The device ``device_name`` names, checked against its interface and, once built (a
    torch extension registers its device type then), against torch; with
    ``trainer.full_determinism`` this process then computes deterministically
    (:func:`plugrl.state.determinism.enable_full_determinism`)."""
    from plugrl.plugin.build import check_constructor, check_torch_device_type

    entry = plugins.registry("devices").get(device_name)
    device_cls = entry.load()
    check_constructor(entry, device_cls)
    device = device_cls(recipe.device, PartContext(recipe=recipe, plugins=plugins))
    check_torch_device_type(entry, device)
    if recipe.trainer.full_determinism:
        # every process that computes builds its device first: the driver, each trainer rank
        # (before it joins the process group), each engine, a reward model's process
        from plugrl.state.determinism import enable_full_determinism

        enable_full_determinism(device)
    return device


def build_backend(
    recipe: Recipe,
    role: Role,
    device: Device,
    dist: DistInfo,
    plugins: PluginManager,
) -> TrainingBackend:
    """The backend ``actor.backend`` names, for one rank of ``role`` (hook first, then import)."""
    from plugrl.plugin.build import build_part

    backend_name = recipe.actor.backend
    plugins.registry("training_backends").get(backend_name).check_available()
    prepare_backend_once(plugins, device.name, backend_name, recipe)
    context = PartContext(recipe=recipe, plugins=plugins, device=device, role=role, dist=dist)
    return build_part("training_backends", backend_name, recipe.actor, context)


def worker_plugin_manager(plugin_modules: Iterable[str] = ()) -> PluginManager:
    """This process's plugin manager, plus the plugin modules the driver registered
    in-process (by import name), so a worker sees the parts the driver sees."""
    plugins = get_plugin_manager()
    for module_name in plugin_modules:
        if plugins.pm.has_plugin(module_name):
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginError(
                f"plugin module {module_name!r}, registered in the driver, cannot be imported "
                f"in a worker ({type(exc).__name__}: {exc}); install it as a package or put "
                "its folder on PYTHONPATH"
            ) from exc
        plugins.register(module, name=module_name)
    return plugins


def node_ip() -> str:
    """This machine's address as other machines see it."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return socket.gethostbyname(socket.gethostname())


def node_id() -> str | None:
    """The id of the Ray node this process runs on; ``None`` outside Ray (without importing
    it: an engine in the driver's process need not pay for that)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


class BackendWorker:
    """One rank of one role: joins the role's process group, then builds and serves the
    backend. Methods return plain values (tensors, dicts, lists) so they cross Ray."""

    def __init__(
        self,
        recipe: Recipe,
        role: Role,
        device_name: str,
        dist: DistInfo,
        plugin_modules: Iterable[str] = (),
    ) -> None:
        self.recipe = recipe
        self.role = role
        self.device_name = device_name
        self.dist = dist
        self.plugin_modules = list(plugin_modules)
        self.backend: TrainingBackend | None = None

    def node_ip(self) -> str:
        return node_ip()

    def node(self) -> tuple[str, str | None]:
        """This rank's machine: its address and Ray node id."""
        return node_ip(), node_id()

    def master_address(self) -> tuple[str, int]:
        """Where rank 0 can host the process group's store: its address and a free port."""
        return node_ip(), free_port()

    def start(
        self,
        master_addr: str | None = None,
        master_port: int | None = None,
        plugins: PluginManager | None = None,
    ) -> list[int]:
        """Join the process group (a single-rank one when no address is given) and build the
        backend; returns ``[dp_rank, dp_size, is_output_rank]`` for dispatching batches.
        ``plugins`` defaults to this process's manager plus the driver's in-process plugin
        modules."""
        self.plugins = plugins = plugins or worker_plugin_manager(self.plugin_modules)
        device = build_device(plugins, self.device_name, self.recipe)
        device.set_device(self.dist.local_rank)
        if master_addr is None or master_port is None:
            ensure_process_group(device, self.dist)
        else:
            init_process_group(device, self.dist, master_addr, master_port)
        self.backend = build_backend(self.recipe, self.role, device, self.dist, plugins)
        backend = self.backend
        return [backend.dp_rank, backend.dp_size, int(backend.is_output_rank)]

    def _backend(self) -> TrainingBackend:
        if self.backend is None:
            raise RuntimeError("the worker has no backend; call start() first")
        return self.backend

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run a backend method; iterators (``named_weights``) come back as lists. An actor
        objective among the arguments resolves its parts from this worker's plugins."""
        from plugrl.algorithms.objective import PolicyObjective

        for argument in (*args, *kwargs.values()):
            if isinstance(argument, PolicyObjective):
                argument.attach(self.plugins)
        result = getattr(self._backend(), method)(*args, **kwargs)
        if method == "named_weights":
            result = list(result)
        return result

    def stream_weight_buckets(self, bucket_bytes: int) -> Iterator[Any]:
        """The backend's weight buckets one at a time (a Ray streaming generator: each bucket
        goes to the object store as it is made; ranks that send nothing yield nothing)."""
        yield from self._backend().weight_buckets(bucket_bytes)

    def transport_send(self, transport_name: str, session: Any) -> Any:
        """Run the worker side of a weight transport in this trainer rank."""
        from plugrl.plugin.build import build_part

        plugins = self.plugins
        backend = self._backend()
        context = PartContext(recipe=self.recipe, plugins=plugins, device=backend.device)
        transport = build_part("weight_transports", transport_name, self.recipe.rollout, context)
        return transport.send(backend, session)

    def pid(self) -> int:
        return os.getpid()
