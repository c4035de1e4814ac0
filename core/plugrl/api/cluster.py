"""The cluster services a plugin may use directly: the engine group a scheduler or a judge
talks to, a backend's process group, and Ray for a part that places actors of its own. An
engine group of a frozen model and a device object are asked of the part's context
(:meth:`plugrl.api.PartContext.frozen_engine_group`,
:meth:`plugrl.api.PartContext.build_device`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.cluster.distributed import ensure_process_group
    from plugrl.cluster.engines import EngineGroup
    from plugrl.cluster.ray_group import ensure_ray, import_ray, init_ray

__all__ = [
    "EngineGroup",
    "ensure_process_group",
    "ensure_ray",
    "import_ray",
    "init_ray",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "EngineGroup": ("plugrl.cluster.engines", "EngineGroup"),
        "ensure_process_group": ("plugrl.cluster.distributed", "ensure_process_group"),
        "ensure_ray": ("plugrl.cluster.ray_group", "ensure_ray"),
        "import_ray": ("plugrl.cluster.ray_group", "import_ray"),
        "init_ray": ("plugrl.cluster.ray_group", "init_ray"),
    },
)
