"""What every part is built with: its own config and a small context.

Every part class has the same constructor shape, ``Part(config, context)``: ``config`` is the
part's own config object (its recipe section, read into the config class it registered) and
``context`` a :class:`PartContext` that says where the part runs and holds what the run around
it provides. Build parts with :func:`plugrl.plugin.build.build_part`, which also checks that the
class fits its interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.parts.device import Device
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

Role = Literal["actor", "ref", "critic"]


@attrs.frozen
class DistInfo:
    """Where a backend rank sits. ``rank``/``world_size`` span the ranks of one role."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


@attrs.frozen(kw_only=True)
class PartContext:
    """The run around a part.

    ``recipe`` is the whole run, read-only: a part reads its own section through ``config``
    and the keys of other sections (``model.path``, ``data.max_response_length``) here.
    The other fields are set where they mean something for the kind being built and are
    ``None`` otherwise (see each interface's docstring).
    """

    recipe: Recipe
    plugins: PluginManager | None = None
    """The plugin manager of the process the part lives in."""
    device: Device | None = None
    """The process's device (backends, engines, reward managers that run a model)."""
    tokenizer: Any = None
    """The run's tokenizer (engines, reward managers)."""
    role: Role | None = None
    """Which model a backend rank holds (backends)."""
    dist: DistInfo = DistInfo()
    """The rank of a backend among its role's ranks (backends)."""
    model_from_trainer: bool = False
    """An engine that will generate with the trainer's live model (``bind_model``) in this
    process, so it must not load weights of its own (engines)."""
    run_dir: Path | None = None
    """The run folder (loggers, schedulers)."""
    options: Any = None
    """The part's own options when they are not a whole section: the parsed
    ``algorithm.adv_estimator_args`` of an estimator, ``actor.policy_loss_args`` of a loss."""
