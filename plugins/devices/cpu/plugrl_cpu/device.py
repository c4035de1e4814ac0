"""CPU as a device."""

from __future__ import annotations

import os
import resource
from typing import Any, ClassVar

import torch

from plugrl.api.devices import Device

BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""CPU flags of bfloat16 dot-product instructions (AVX512-BF16, AMX): oneDNN's bfloat16 matrix
products then run about twice as fast as float32 ones; without them they are emulated, and
slower."""
BFLOAT16_ENV = "PLUGRL_CPU_BFLOAT16"
"""``1``/``0`` overrides what the CPU's flags say about bfloat16 (``rollout.dtype: auto``)."""


def cpu_flags() -> frozenset[str]:
    """The feature flags of this machine's CPU (empty where ``/proc/cpuinfo`` is not there)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


class CpuDevice(Device):
    """Ranks are processes; collectives use gloo; Ray places ranks by CPU."""

    name: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    ray_resource: ClassVar[str | None] = None

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def deterministic_env(cls) -> dict[str, str]:
        # MKL's conditional numerical reproducibility mode: code paths that give the same
        # results run to run on this CPU with the same number of threads (read when MKL
        # starts: it holds for a process that sets it before its first matrix product)
        return {"MKL_CBWR": "AUTO"}

    def device_count(self) -> int:
        return os.cpu_count() or 1

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def rng_state(self) -> dict[str, Any]:
        return {}

    def fast_bfloat16(self) -> bool:
        """Whether the CPU has bfloat16 dot-product instructions that torch uses (through
        oneDNN); ``PLUGRL_CPU_BFLOAT16=1`` or ``0`` says so instead."""
        override = os.environ.get(BFLOAT16_ENV)
        if override is not None:
            if override not in ("0", "1"):
                raise ValueError(
                    f"{BFLOAT16_ENV} is {override!r}; set it to 1 (bfloat16 is fast here) or 0 "
                    "(it is not), or unset it to go by the CPU's flags"
                )
            return override == "1"
        return bool(cpu_flags() & BFLOAT16_FLAGS) and torch.backends.mkldnn.is_available()

    def memory_metrics(self) -> dict[str, float]:
        # ru_maxrss is KiB on Linux: the peak resident memory of this process
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"perf/cpu_memory_used_gb": peak_kib / 1024**2}
