"""CPU as a device."""

from __future__ import annotations

import os
import resource
from typing import Any, ClassVar

import torch

from plugrl.parts.device import Device


class CpuDevice(Device):
    """Ranks are processes; collectives use gloo; Ray places ranks by CPU."""

    name: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    ray_resource: ClassVar[str | None] = None

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return os.cpu_count() or 1

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def rng_state(self) -> dict[str, Any]:
        return {}

    def memory_metrics(self) -> dict[str, float]:
        # ru_maxrss is KiB on Linux: the peak resident memory of this process
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"perf/cpu_memory_used_gb": peak_kib / 1024**2}
