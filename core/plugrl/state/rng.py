"""The random generators a run draws from, captured and restored in one format (the seeds of
what a run samples are :mod:`plugrl.state.seeds`'s, which needs no torch).

:func:`capture` holds Python's, NumPy's and torch's generator states, and the device's
(:meth:`Device.rng_state <plugrl.parts.device.Device.rng_state>`), as tensors, numbers and
lists only, so a checkpoint that stores them loads with ``torch.load(weights_only=True)``;
:func:`state_problem` checks that what a checkpoint holds has the shape :func:`restore` reads.
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


_NUMPY_KEYS = ("kind", "keys", "position", "has_gauss", "cached")


def state_problem(state: Any) -> str | None:
    """What keeps :func:`restore` from reading ``state`` (``"has no 'numpy'"``...), or
    ``None`` when it has the shape :func:`capture` gives."""
    if not isinstance(state, dict):
        return f"is a {type(state).__name__}, not a dict"
    for key in ("torch", "python", "numpy"):
        if key not in state:
            return f"has no {key!r}"
    if not isinstance(state["torch"], torch.Tensor) or state["torch"].dtype != torch.uint8:
        return "has a 'torch' that is not a byte tensor"
    python = state["python"]
    if not (
        isinstance(python, (list, tuple))
        and len(python) == 3
        and isinstance(python[1], (list, tuple))
    ):
        return "has a 'python' that is not [version, internal state, gauss]"
    numpy_state = state["numpy"]
    if not isinstance(numpy_state, dict):
        return "has a 'numpy' that is not a dict"
    for key in _NUMPY_KEYS:
        if key not in numpy_state:
            return f"has a 'numpy' without {key!r}"
    if not isinstance(numpy_state["keys"], torch.Tensor):
        return "has a 'numpy' whose 'keys' is not a tensor"
    if not isinstance(state.get("device", {}), dict):
        return "has a 'device' that is not a dict"
    return None


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
