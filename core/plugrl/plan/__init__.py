"""Device memory plans: will a recipe fit, per device and per phase, before anything loads.

* :mod:`~plugrl.plan.shape`: a model's shape from its ``config.json`` (or a shipped shape);
* :mod:`~plugrl.plan.terms`: :class:`MemoryTerm`, :class:`PhaseEstimate`, :class:`Plan`;
* :mod:`~plugrl.plan.context`: what the ``estimate_memory`` hook gets besides the recipe;
* :mod:`~plugrl.plan.formulas`: the shared formulas plugins build their terms from;
* :mod:`~plugrl.plan.estimate`: :func:`plan_recipe`, the hook's answers grouped and judged;
* :mod:`~plugrl.plan.solve`: what to change when it does not fit;
* :mod:`~plugrl.plan.render`: the terminal table and the JSON.

docs/plan.md explains every term.
"""

from plugrl.plan.context import MicroBatch, PlanContext
from plugrl.plan.estimate import model_shape, plan_recipe
from plugrl.plan.shape import ModelShape, named_shapes, read_shape, shape_from_config
from plugrl.plan.terms import (
    GIB,
    MIB,
    PHASES,
    MemoryTerm,
    PhaseEstimate,
    Plan,
    Suggestion,
    Unestimated,
    dtype_bytes,
)

__all__ = [
    "GIB",
    "MIB",
    "PHASES",
    "MemoryTerm",
    "MicroBatch",
    "ModelShape",
    "PhaseEstimate",
    "Plan",
    "PlanContext",
    "Suggestion",
    "Unestimated",
    "dtype_bytes",
    "model_shape",
    "named_shapes",
    "plan_recipe",
    "read_shape",
    "shape_from_config",
]
