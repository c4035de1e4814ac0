"""The services a part asks the run for through its context
(:class:`plugrl.parts.context.PartContext`): a device object of its own, and an engine group of
a model that does not train."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from plugrl.cluster.engines import EngineGroup
    from plugrl.parts.context import PartContext
    from plugrl.parts.device import Device
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.recipe import ModelConfig


@attrs.frozen
class RunServices:
    """The kernel's :class:`~plugrl.parts.context.PartServices`: stateless, so a context that
    holds it can be sent to a worker process."""

    def build_device(self, context: PartContext) -> Device:
        from plugrl.cluster.worker import build_device

        assert context.plugins is not None  # device_name() refuses a context without plugins
        return build_device(context.plugins, context.device_name(), context.recipe)

    def frozen_engine_group(
        self, context: PartContext, model: ModelConfig, rollout: RolloutConfig
    ) -> EngineGroup:
        from plugrl.cluster.engines import make_frozen_engine_group

        assert context.plugins is not None
        return make_frozen_engine_group(
            context.recipe,
            model=model,
            rollout=rollout,
            device_name=context.device_name(),
            plugins=context.plugins,
        )
