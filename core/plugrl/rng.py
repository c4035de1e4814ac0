"""The random generators a run draws from, captured and restored in one format.

:func:`capture` holds Python's, NumPy's and torch's generator states, and the device's
(:meth:`Device.rng_state <plugrl.parts.device.Device.rng_state>`), as tensors, numbers and
lists only, so a checkpoint that stores them loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from plugrl.parts.device import Device


def capture(device: Device | None = None) -> dict[str, Any]:
    """Every generator's state (the device's too when given)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "device": device.rng_state() if device is not None else {},
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }


def restore(state: dict[str, Any], device: Device | None = None) -> None:
    """Put back what :func:`capture` returned (the device's part when a device is given)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached"],
        )
    )
    if device is not None:
        device.set_rng_state(state.get("device") or {})


def seed_all(seed: int, device: Device | None = None) -> None:
    """Seed Python's, NumPy's and torch's generators (and the device's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if device is not None:
        device.manual_seed(seed)
    else:
        torch.manual_seed(seed)
