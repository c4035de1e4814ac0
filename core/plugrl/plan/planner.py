"""Plans of one recipe file under changing overrides: what ``plugrl plan`` and its solver use,
and the check a run makes at launch (``trainer.memory_check``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from plugrl.errors import RecipeError
from plugrl.plan.estimate import model_shape, plan_recipe
from plugrl.plan.shape import ModelShape
from plugrl.plan.solve import solve_key, suggest
from plugrl.plan.terms import GIB, Plan

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.plan")


class RecipePlanner:
    """A recipe file read once; :meth:`plan` answers for it with more overrides in a few
    milliseconds, which is what lets the solver bisect."""

    def __init__(
        self,
        recipe: str | None,
        overrides: Sequence[str],
        plugins: PluginManager,
        *,
        device_memory: int | None = None,
        model_config: str | None = None,
        fallback_shape: Callable[[Recipe], ModelShape | None] | None = None,
    ) -> None:
        """``fallback_shape(recipe)`` gives a shape when ``model.path`` cannot be read (a
        folder a command builds later) and no ``model_config`` is given; None: the error
        stands."""
        from plugrl.recipe import compose_file, find_recipe

        self.raw = compose_file(find_recipe(recipe)) if recipe is not None else {}
        self.overrides = list(overrides)
        self.plugins = plugins
        self.device_memory = device_memory
        self.recipe = self.read([])
        try:
            self.shape: ModelShape = model_shape(self.recipe, model_config)
        except RecipeError:
            fallback = (
                None if model_config or fallback_shape is None else fallback_shape(self.recipe)
            )
            if fallback is None:
                raise
            self.shape = fallback

    def read(self, extra: Sequence[str]) -> Recipe:
        """The recipe with the base overrides and ``extra``; the chosen parts' libraries need
        not be installed here (a plan is for the machine that will run it)."""
        from plugrl.recipe import apply_overrides, build_recipe

        raw = apply_overrides(self.raw, [*self.overrides, *extra])
        return build_recipe(raw, self.plugins, runnable_here=False)

    def plan(self, extra: Sequence[str] = ()) -> Plan:
        recipe = self.read(extra) if extra else self.recipe
        shape = self.shape
        if any(item.startswith("model.path=") for item in extra):
            shape = model_shape(recipe)
        return plan_recipe(recipe, self.device_memory, self.plugins, shape=shape)

    def solve(self, key: str) -> tuple[Any, Plan] | None:
        """The largest value of ``key`` that fits (see :func:`solve_key`)."""
        from plugrl.recipe.composition import parse_override

        path, _ = parse_override(f"{key}=0")
        current: Any = self.recipe
        for part in path:
            if not hasattr(current, part):
                raise RecipeError(f"no such key {key}; see plugrl explain {key}", key=key)
            current = getattr(current, part)
        return solve_key(self.plan, key, current)

    def plan_with_suggestions(self) -> Plan:
        """The plan, and when it does not fit, the single changes that would make it."""
        import attrs

        from plugrl.plan.context import trainer_ranks

        plan = self.plan()
        if plan.fits is False:
            found = suggest(self.plan, self.recipe, trainer_ranks(self.recipe))
            plan = attrs.evolve(plan, suggestions=tuple(found))
        return plan


def launch_device_memory(recipe: Recipe, device_cls: Any, device_name: str) -> int | None:
    """The memory the launch check judges by: ``trainer.device_memory_gib``, else what an
    accelerator reports; None on cpu (the check is off there unless the key is set)."""
    if recipe.trainer.device_memory_gib is not None:
        return int(recipe.trainer.device_memory_gib * GIB)
    if device_name == "cpu":
        return None
    try:
        return device_cls().total_memory()
    except Exception as exc:  # a device that cannot tell is not a reason to stop a run
        logger.info(
            "memory check skipped: the %s device did not report its memory (%s)", device_name, exc
        )
        return None


def check_memory_at_launch(
    recipe: Recipe, plugins: PluginManager, device_cls: Any, device_name: str
) -> str | None:
    """The check ``trainer.memory_check`` asks for, before any model loads: the one-line
    finding when a phase does not fit (logged as a warning, or raised as a
    :class:`RecipeError` with ``error``), else None. Cheap: the model's config.json only."""
    mode = recipe.trainer.memory_check
    if mode in ("off", False):
        return None
    memory = launch_device_memory(recipe, device_cls, device_name)
    if memory is None:
        return None
    try:
        plan = plan_recipe(recipe, memory, plugins)
    except RecipeError as exc:
        logger.warning("memory check skipped: %s", exc)
        return None
    if plan.fits is not False:
        return None
    worst = plan.worst()
    assert worst is not None
    largest = worst.largest_term()
    term = f"{largest.role} {largest.name} ({largest.bytes / GIB:.1f} GiB)" if largest else "-"
    line = (
        f"memory check: the {worst.phase} phase needs {worst.peak / GIB:.1f} GiB on each "
        f"{worst.devices} device, {memory / GIB:.1f} GiB there ({-(worst.margin or 0) / GIB:.1f} "
        f"GiB over); largest term: {term}. See every term and what would fit: plugrl plan "
        f"RECIPE [KEY=VALUE ...] --device-memory {memory / GIB:.0f}GiB"
    )
    if mode == "error":
        raise RecipeError(line + "; or set trainer.memory_check=warn", key="trainer.memory_check")
    logger.warning("%s", line)
    return line
