"""The worker groups and the placement a recipe asks for: local, or on Ray."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.cluster.local import LocalWorkerGroup

if TYPE_CHECKING:
    from collections.abc import Sequence

    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.ray_group import RayPlacement
    from plugrl.parts.backend import Role
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe


def make_placement(
    recipe: Recipe,
    roles: Sequence[Role],
    *,
    device_name: str,
    plugins: PluginManager,
) -> RayPlacement | None:
    """For ``cluster: ray``, the devices the ``roles`` of a run share: one bundle per rank
    (``trainer.nnodes x trainer.n_gpus_per_node``), rank ``i`` of every role on bundle ``i``.
    ``None`` for ``cluster: local``. Close it after the groups placed on it."""
    if recipe.cluster.mode != "ray":
        return None
    from plugrl.cluster.ray_group import RayPlacement

    device_cls = plugins.registry("devices").load(device_name)
    return RayPlacement(
        recipe.cluster,
        world_size=recipe.trainer.nnodes * recipe.trainer.n_gpus_per_node,
        resource=device_cls.ray_resource,
        roles=roles,
    )


def make_worker_group(
    recipe: Recipe,
    role: Role,
    *,
    device_name: str,
    world_size: int | None = None,
    plugins: PluginManager,
    placement: RayPlacement | None = None,
) -> WorkerGroup:
    """The worker group ``cluster.mode`` asks for. A Ray group has ``world_size`` ranks
    (default: the placement's, else ``trainer.nnodes x trainer.n_gpus_per_node``), on
    ``placement`` when given (see :func:`make_placement`); a local one has one."""
    if recipe.cluster.mode == "ray":
        from plugrl.cluster.ray_group import RayWorkerGroup

        default = placement.world_size if placement is not None else None
        ranks = world_size or default or recipe.trainer.nnodes * recipe.trainer.n_gpus_per_node
        return RayWorkerGroup(
            recipe,
            role,
            world_size=ranks,
            device_name=device_name,
            plugins=plugins,
            placement=placement,
        )
    if world_size not in (None, 1):
        from plugrl.errors import RecipeError

        raise RecipeError(
            f"'local' runs one rank in this process, not {world_size}; use cluster.mode=ray "
            "for more",
            key="cluster.mode",
        )
    return LocalWorkerGroup(recipe, role, device_name=device_name, plugins=plugins)
