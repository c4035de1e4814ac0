"""Devices: where tensors live and how ranks talk to each other."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from plugrl.config import option
from plugrl.errors import PluginError

if TYPE_CHECKING:
    import torch

    from plugrl.parts.context import PartContext
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

WorkerKind = Literal["trainer", "rollout"]


@attrs.define(kw_only=True)
class DeviceConfig:
    """The ``device`` section. ``device: cuda`` is short for ``device: {name: cuda}``."""

    name: str = option(
        "auto",
        "Device kind. 'auto' takes the first one a plugin detects (cuda, npu, ...), else cpu.",
        verl="trainer.device",
        registry="devices",
    )


class Device(ABC):
    """A kind of accelerator (or the CPU). One instance per process.

    Subclasses set the class attributes and implement the abstract methods; the defaults of
    the others suit a device that torch drives through ``torch.<name>``. Built as
    ``Device(config, context)`` (``context`` may be ``None``: devices are built first, in every
    process).
    """

    name: ClassVar[str]
    """Registered name: what ``device.name`` says in a recipe (``"cuda"``, ``"npu"``, ``"cpu"``)."""
    torch_device_type: ClassVar[str]
    """The device type torch knows this device by: what ``torch.device(...)``, device meshes
    and FSDP are given (``"cuda"``, ``"npu"``, ``"cpu"``; a torch extension's own type, such
    as the one it renames ``privateuseone`` to). Default: :attr:`name`, set on the first class
    that names itself; a subclass of a device keeps its parent's. Checked at start-up:
    ``torch.device(torch_device_type)`` must work once the device is built."""
    dist_backend: ClassVar[str]
    """torch.distributed backend for collectives between ranks (``gloo``, ``nccl``, ``hccl``)."""
    ray_resource: ClassVar[str | None] = None
    """Ray resource that places one rank (``"GPU"``, ``"NPU"``); ``None`` places by CPU."""
    visible_devices_env: ClassVar[str | None] = None
    """Environment variable that restricts the devices a process sees (``CUDA_VISIBLE_DEVICES``)."""
    kubernetes_resource: ClassVar[str | None] = None
    """Kubernetes resource a pod asks for one device by (``"nvidia.com/gpu"``); ``None``: the
    device is not scheduled on Kubernetes by a resource (the CPU)."""
    slurm_gres: ClassVar[str | None] = None
    """Slurm generic resource of one device (``"gpu"``: ``--gres=gpu:8``); ``None``: none."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the registered name is the torch type unless the class, or a device it extends,
        # says otherwise
        if "name" in vars(cls) and getattr(cls, "torch_device_type", None) is None:
            cls.torch_device_type = cls.name

    def __init__(self, config: DeviceConfig | None = None, context: PartContext | None = None):
        self.config = config or DeviceConfig(name=self.name)
        self.context = context

    @classmethod
    def worker_env(cls, kind: WorkerKind) -> dict[str, str]:
        """Environment variables a worker process of this device needs before torch starts:
        allocator and collective settings, for a ``"trainer"`` rank or a ``"rollout"``
        engine. Workers get them unless the user's environment sets the same variable; which
        devices a worker sees is set by Ray from the device's resource."""
        return {}

    @classmethod
    def deterministic_env(cls) -> dict[str, str]:
        """Environment variables that make this device's libraries choose deterministic
        algorithms (matrix products, collectives), for a run with ``trainer.full_determinism``.
        Set in every process of the run before it computes or joins a process group, unless
        the user's environment sets the same variable."""
        return {}

    def make_deterministic(self) -> None:
        """Switch this device's libraries to deterministic algorithms in this process, for a
        run with ``trainer.full_determinism`` (torch's own switch,
        ``torch.use_deterministic_algorithms``, is the caller's)."""

    @classmethod
    def network_env(cls, interface: str) -> dict[str, str]:
        """Environment variables that make this device's collectives between nodes use the
        network interface ``interface`` (``eth0``): what ``launch.network_interface`` sets on
        every node of a launched job. The default names gloo's, which torch uses for CPU
        collectives on every device; a device whose library reads its own adds it."""
        return {"GLOO_SOCKET_IFNAME": interface}

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this device can be used in this process (library present, hardware seen)."""

    @abstractmethod
    def device_count(self) -> int:
        """Devices visible to this process (the number of CPU ranks for ``cpu``)."""

    @abstractmethod
    def torch_device(self, local_rank: int = 0) -> torch.device:
        """The torch device for the given local rank."""

    def set_device(self, local_rank: int) -> None:
        """Bind this process to one device (before creating tensors)."""

    @abstractmethod
    def manual_seed(self, seed: int) -> None:
        """Seed torch's and the device's random generators."""

    def rng_state(self) -> dict[str, Any]:
        """Random generator states to checkpoint (torch's CPU state is saved by the caller)."""
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""

    def synchronize(self) -> None:
        """Wait for queued device work (for honest timings)."""

    def empty_cache(self) -> None:
        """Release cached device memory back to the driver."""

    def memory_metrics(self) -> dict[str, float]:
        """Memory figures under verl's names: ``perf/max_memory_allocated_gb``,
        ``perf/max_memory_reserved_gb``, ``perf/cpu_memory_used_gb``."""
        return {}

    def total_memory(self) -> int | None:
        """Bytes of memory of one device, what ``plugrl plan`` and the check at launch
        (``trainer.memory_check``) judge a recipe against; None when it has no memory of its
        own to judge (the CPU) or cannot tell."""
        return None

    def fast_bfloat16(self) -> bool:
        """Whether bfloat16 matrix products run faster than float32 ones here: what
        ``rollout.dtype: auto`` resolves by (bfloat16 when they do, else float32). True by
        default: accelerators have bfloat16 units."""
        return True


def resolve_device_name(recipe: Recipe, plugins: PluginManager) -> str:
    """The device a run uses: ``device.name``, or for ``auto`` the first one a plugin detects."""
    name = recipe.device.name
    if name != "auto":
        return name
    detected = plugins.hook.detect_device()
    if detected is None:
        raise PluginError(
            "device.name is 'auto' but no plugin detected a device (the plugin manager has "
            "no device plugin: was it built without loading the installed plugins?); set "
            "device.name"
        )
    return detected
