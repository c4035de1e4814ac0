"""The plugin API: everything a plugin may import from plugrl, in one place.

A plugin imports from ``plugrl.api`` and its submodules only (and, in its tests, from
:mod:`plugrl.testing`); the rest of the kernel is private and may change without notice. See
"The plugin API" in docs/plugins.md for the policy on changing these names.

* ``plugrl.api``: the hook marker, the context every part is built with, errors, config
  option helpers, the recipe's shared sections, and :class:`Batch`;
* :mod:`plugrl.api.algorithms`: estimator, loss and KL interfaces and the shared formulas;
* :mod:`plugrl.api.backend`: the training-backend interface and the kit backends share;
* :mod:`plugrl.api.rollout`: the rollout-engine interface and its request types;
* :mod:`plugrl.api.scheduler`: the scheduler interface and the step pieces schedulers share;
* :mod:`plugrl.api.rewards`: the reward-manager interface and the scoring kit;
* :mod:`plugrl.api.agents`: environments, tools, tool-call parsers and agent loops;
* :mod:`plugrl.api.loggers`: the metric-logger interface and the metrics file;
* :mod:`plugrl.api.devices`: the device interface;
* :mod:`plugrl.api.health`: the learning-health check interface;
* :mod:`plugrl.api.launch`: the launcher interface (``plugrl launch``) and the job it writes;
* :mod:`plugrl.api.workers`: worker processes a timeout can kill, and event-loop threads;
* :mod:`plugrl.api.data`: the batch, tokenizer and dataset helpers;
* :mod:`plugrl.api.cluster`: the cluster services a plugin may use directly;
* :mod:`plugrl.api.plan`: the memory terms an ``estimate_memory`` hook returns, and their
  shared formulas.

Importing ``plugrl.api`` imports neither torch nor a plugin (a plugin's ``__init__`` imports it
to register); :class:`Batch` is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl import hookimpl
    from plugrl.config import (
        ConfigValueError,
        PackageNeed,
        fraction,
        non_negative,
        one_of,
        option,
        positive,
        section,
    )
    from plugrl.config.structuring import structure
    from plugrl.data.batch import Batch
    from plugrl.errors import (
        CheckpointError,
        DataError,
        HealthError,
        PluginError,
        PlugrlError,
        RecipeError,
        UnknownNameError,
    )
    from plugrl.parts.context import (
        DistInfo,
        EngineSpan,
        PartContext,
        PartServices,
        Role,
        SpanNode,
    )
    from plugrl.recipe import (
        ClusterConfig,
        DataConfig,
        ModelConfig,
        Recipe,
        TrainerConfig,
        build_recipe,
        load_recipe,
        part_args,
        read_section,
    )
    from plugrl.recipe.composition import nested_deeper_than

__all__ = [
    "Batch",
    "CheckpointError",
    "ClusterConfig",
    "ConfigValueError",
    "DataConfig",
    "DataError",
    "DistInfo",
    "EngineSpan",
    "HealthError",
    "ModelConfig",
    "PackageNeed",
    "PartContext",
    "PartServices",
    "PluginError",
    "PlugrlError",
    "Recipe",
    "RecipeError",
    "Role",
    "SpanNode",
    "TrainerConfig",
    "UnknownNameError",
    "build_recipe",
    "fraction",
    "hookimpl",
    "load_recipe",
    "nested_deeper_than",
    "non_negative",
    "one_of",
    "option",
    "part_args",
    "positive",
    "read_section",
    "section",
    "structure",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "Batch": ("plugrl.data.batch", "Batch"),
        "CheckpointError": ("plugrl.errors", "CheckpointError"),
        "ClusterConfig": ("plugrl.recipe", "ClusterConfig"),
        "ConfigValueError": ("plugrl.config", "ConfigValueError"),
        "DataConfig": ("plugrl.recipe", "DataConfig"),
        "DataError": ("plugrl.errors", "DataError"),
        "DistInfo": ("plugrl.parts.context", "DistInfo"),
        "EngineSpan": ("plugrl.parts.context", "EngineSpan"),
        "SpanNode": ("plugrl.parts.context", "SpanNode"),
        "HealthError": ("plugrl.errors", "HealthError"),
        "ModelConfig": ("plugrl.recipe", "ModelConfig"),
        "PackageNeed": ("plugrl.config", "PackageNeed"),
        "PartContext": ("plugrl.parts.context", "PartContext"),
        "PartServices": ("plugrl.parts.context", "PartServices"),
        "PluginError": ("plugrl.errors", "PluginError"),
        "PlugrlError": ("plugrl.errors", "PlugrlError"),
        "Recipe": ("plugrl.recipe", "Recipe"),
        "RecipeError": ("plugrl.errors", "RecipeError"),
        "Role": ("plugrl.parts.context", "Role"),
        "TrainerConfig": ("plugrl.recipe", "TrainerConfig"),
        "UnknownNameError": ("plugrl.errors", "UnknownNameError"),
        "build_recipe": ("plugrl.recipe", "build_recipe"),
        "fraction": ("plugrl.config", "fraction"),
        "hookimpl": ("plugrl", "hookimpl"),
        "load_recipe": ("plugrl.recipe", "load_recipe"),
        "nested_deeper_than": ("plugrl.recipe.composition", "nested_deeper_than"),
        "non_negative": ("plugrl.config", "non_negative"),
        "one_of": ("plugrl.config", "one_of"),
        "option": ("plugrl.config", "option"),
        "part_args": ("plugrl.recipe", "part_args"),
        "positive": ("plugrl.config", "positive"),
        "read_section": ("plugrl.recipe", "read_section"),
        "section": ("plugrl.config", "section"),
        "structure": ("plugrl.config.structuring", "structure"),
    },
)
