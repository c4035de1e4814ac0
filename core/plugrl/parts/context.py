"""What every part is built with: its own config and a small context.

Every part class has the same constructor shape, ``Part(config, context)``: ``config`` is the
part's own config object (its recipe section, read into the config class it registered) and
``context`` a :class:`PartContext` that says where the part runs and holds what the run around
it provides. Build parts with :func:`plugrl.plugin.build.build_part`, which also checks that the
class fits its interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

from plugrl.errors import PluginError

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.cluster.engines import EngineGroup
    from plugrl.parts.device import Device
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import ModelConfig, Recipe

Role = Literal["actor", "ref", "critic"]


class PartServices(Protocol):
    """What the run builds for a part on request; the kernel's is
    :class:`plugrl.cluster.services.RunServices`. A protocol here, so that the part interfaces
    do not import the cluster that implements it."""

    def build_device(self, context: PartContext) -> Device:
        """A new device object for the run's device (``context.device_name()``)."""
        ...

    def frozen_engine_group(
        self, context: PartContext, model: ModelConfig, rollout: RolloutConfig
    ) -> EngineGroup:
        """Engines that serve ``model`` with ``rollout`` and never receive weights."""
        ...


@attrs.frozen
class DistInfo:
    """Where a backend rank sits. ``rank``/``world_size`` span the ranks of one role."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


@attrs.frozen(kw_only=True)
class SpanNode:
    """One Ray node's share of the devices an engine spans."""

    node_id: str
    bundles: tuple[int, ...]
    """The engine's bundles of the placement that sit on this node, in span order."""
    devices: tuple[str, ...]
    """The ids of their devices (as the device's ``visible_devices_env`` names them; none on
    CPU)."""
    actor_options: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    """Ray actor options that place an actor on the first of ``bundles`` (in the engine's
    placement group, taking the engine's share of that bundle) and let it see ``devices``:
    how an engine starts its own worker process on this node."""


@attrs.frozen(kw_only=True)
class EngineSpan:
    """Where an engine of several devices sits when they are on more than one Ray node: the
    engine's own node first (its actor runs there), then the others, each with the bundles
    and devices the engine has there. An engine whose class says it can span nodes
    (:attr:`RolloutEngine.spans_nodes <plugrl.parts.rollout.RolloutEngine.spans_nodes>`)
    starts its tensor-parallel workers of the other nodes itself, on these bundles."""

    nodes: tuple[SpanNode, ...]
    placement_group: Any = attrs.field(default=None, eq=False, repr=False)
    """The Ray placement group holding the bundles."""
    device_share: float = 1.0
    """The share of each bundle's devices the engine's workers may ask Ray for: the engine's
    own actor asks for none of its bundle's devices when its span crosses nodes, so that a
    worker of its own can take them there too."""

    @property
    def bundles(self) -> tuple[int, ...]:
        """Every bundle of the span, node by node."""
        return tuple(b for node in self.nodes for b in node.bundles)


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
    engine_span: EngineSpan | None = None
    """Where an engine's devices are when they sit on several Ray nodes (engines); ``None``
    for an engine of one node."""
    run_dir: Path | None = None
    """The run folder (loggers, schedulers)."""
    options: Any = None
    """The part's own options when they are not a whole section: the parsed
    ``algorithm.adv_estimator_args`` of an estimator, ``actor.policy_loss_args`` of a loss."""
    services: PartServices | None = None
    """What the run builds on request (:meth:`build_device`, :meth:`frozen_engine_group`);
    set by the kernel wherever it builds a part, and by :func:`plugrl.testing.part_context`."""

    def device_name(self) -> str:
        """The run's device: ``device.name``, or for ``auto`` the one a device plugin detects."""
        from plugrl.parts.device import resolve_device_name

        if self.plugins is None:
            raise PluginError(
                "the run's device is resolved by its device plugins, and this part's context "
                "has no plugin manager; build the context with plugins=..."
            )
        return resolve_device_name(self.recipe, self.plugins)

    def build_device(self) -> Device:
        """A new device object of the run's device, for a part that runs a model where the
        run gave it no device (``device`` is ``None``)."""
        return self._services("build a device").build_device(self)

    def frozen_engine_group(self, model: ModelConfig, rollout: RolloutConfig) -> EngineGroup:
        """Engines that serve a second model that does not train (an LLM judge): ``model``
        and its engine section ``rollout`` (read with :func:`plugrl.api.read_section`) in
        place of the run's. They load ``model.path`` themselves, never receive weights and
        never sit on the trainer's devices (in this process for ``cluster: local``, on a Ray
        placement of their own otherwise). Close the group when done with it."""
        return self._services("start a frozen engine group").frozen_engine_group(
            self, model, rollout
        )

    def _services(self, purpose: str) -> PartServices:
        if self.services is None:
            raise PluginError(
                f"this part's context has no run services to {purpose}; build the part "
                "through the run, or in a test with plugrl.testing.part_context"
            )
        return self.services
