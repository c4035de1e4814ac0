"""What runs where a backend rank lives: build the backend and call its methods.

:class:`BackendWorker` is a plain class so that it can be hosted in-process
(:class:`~plugrl.cluster.local.LocalWorkerGroup`) or wrapped as a Ray actor at run time
(:class:`~plugrl.cluster.ray_group.RayWorkerGroup`). It stays undecorated and imports torch
only inside the functions it calls: Ray pickles the class it is given, and a class whose
methods reach torch's globals drags unpicklable modules along.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plugrl.cluster.distributed import ensure_process_group, free_port, init_process_group
from plugrl.errors import PluginError
from plugrl.parts.backend import DistInfo
from plugrl.plugins import PluginManager, get_plugin_manager

if TYPE_CHECKING:
    from plugrl.parts.backend import Role, TrainingBackend
    from plugrl.parts.device import Device
    from plugrl.recipe import Recipe


def prepare_backend_once(
    plugins: PluginManager, device_name: str, backend_name: str, recipe: Recipe
) -> None:
    """Call the ``prepare_backend`` hook the first time this process builds ``backend_name``
    on ``device_name``, before the backend's module is imported."""
    key = (device_name, backend_name)
    if key in plugins.prepared_backends:
        return
    plugins.hook.prepare_backend(device=device_name, backend=backend_name, recipe=recipe)
    plugins.prepared_backends.add(key)


def build_device(plugins: PluginManager, device_name: str, recipe: Recipe) -> Device:
    device_cls = plugins.registry("devices").load(device_name)
    return device_cls(recipe.device)


def build_backend(
    recipe: Recipe,
    role: Role,
    device: Device,
    dist: DistInfo,
    plugins: PluginManager,
) -> TrainingBackend:
    """The backend ``actor.backend`` names, for one rank of ``role`` (hook first, then import)."""
    backend_name = recipe.actor.backend
    entry = plugins.registry("training_backends").get(backend_name)
    entry.check_available()
    prepare_backend_once(plugins, device.name, backend_name, recipe)
    backend_cls = entry.load()
    return backend_cls(recipe, role=role, device=device, dist=dist)


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
        backend; returns ``[dp_rank, dp_size]`` for dispatching batches. ``plugins`` defaults
        to this process's manager plus the driver's in-process plugin modules."""
        plugins = plugins or worker_plugin_manager(self.plugin_modules)
        device = build_device(plugins, self.device_name, self.recipe)
        device.set_device(self.dist.local_rank)
        if master_addr is None or master_port is None:
            ensure_process_group(device, self.dist)
        else:
            init_process_group(device, self.dist, master_addr, master_port)
        self.backend = build_backend(self.recipe, self.role, device, self.dist, plugins)
        return [self.backend.dp_rank, self.backend.dp_size]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run a backend method; iterators (``named_weights``) come back as lists."""
        if self.backend is None:
            raise RuntimeError("the worker has no backend; call start() first")
        result = getattr(self.backend, method)(*args, **kwargs)
        if method == "named_weights":
            result = list(result)
        return result

    def pid(self) -> int:
        return os.getpid()
