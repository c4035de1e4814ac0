"""``trainer.full_determinism``: the same seed on the same hardware gives the same run.

:func:`enable_full_determinism` runs in every process that computes, when it builds its device
(:func:`plugrl.cluster.worker.build_device`): the device's environment
(:meth:`Device.deterministic_env <plugrl.parts.device.Device.deterministic_env>`), torch's
deterministic algorithms with no fallback (an operation that has none raises, naming itself,
rather than run nondeterministically), and the device's own switches
(:meth:`Device.make_deterministic <plugrl.parts.device.Device.make_deterministic>`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plugrl.parts.device import Device

logger = logging.getLogger("plugrl.run")


def enable_full_determinism(device: Device) -> dict[str, str]:
    """Make this process compute deterministically on ``device``; returns the environment
    variables it set (those the user had set are kept as they are)."""
    import torch

    applied: dict[str, str] = {}
    for key, value in type(device).deterministic_env().items():
        if key in os.environ:
            if os.environ[key] != value:
                logger.info(
                    "trainer.full_determinism: keeping %s=%s from the environment (the %s "
                    "device would set %s)",
                    key,
                    os.environ[key],
                    device.name,
                    value,
                )
            continue
        os.environ[key] = value
        applied[key] = value
    torch.use_deterministic_algorithms(True, warn_only=False)
    device.make_deterministic()
    return applied
