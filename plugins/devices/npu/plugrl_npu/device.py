"""Ascend NPUs as a device: torch_npu's ``torch.npu``, hccl between ranks, the Ray resource
``NPU``."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, ClassVar

import attrs
import torch

from plugrl.api import option
from plugrl.api.devices import Device, DeviceConfig

_GIB = 1024**3


@attrs.define(kw_only=True)
class NpuDeviceConfig(DeviceConfig):
    """The ``device`` section with ``name: npu``."""

    fused_kernels: bool = option(
        True,
        "With actor.backend fsdp2, run the Qwen2/Qwen3 RMSNorm, SwiGLU MLP and rotary "
        "embedding of transformers on torch_npu's fused kernels (npu_rms_norm, npu_swiglu, "
        "npu_rotary_mul), as verl does on NPU.",
    )


def torch_npu_present() -> bool:
    """Whether torch_npu can be imported, found without importing it (importing it without
    Ascend CANN fails)."""
    try:
        return importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        return False


def npu() -> Any:
    """``torch.npu``, which exists once torch_npu is imported."""
    importlib.import_module("torch_npu")
    return torch.npu


class NpuDevice(Device):
    """One NPU per rank; collectives use hccl; Ray places ranks by the ``NPU`` resource."""

    name: ClassVar[str] = "npu"
    torch_device_type: ClassVar[str] = "npu"  # the type torch_npu registers, once imported
    dist_backend: ClassVar[str] = "hccl"
    ray_resource: ClassVar[str | None] = "NPU"
    visible_devices_env: ClassVar[str | None] = "ASCEND_RT_VISIBLE_DEVICES"
    # the name Ascend's Kubernetes device plugin gives Atlas 800 (910) cards
    kubernetes_resource: ClassVar[str | None] = "huawei.com/Ascend910"
    slurm_gres: ClassVar[str | None] = "npu"

    @classmethod
    def network_env(cls, interface: str) -> dict[str, str]:
        return {**super().network_env(interface), "HCCL_SOCKET_IFNAME": interface}

    def __init__(self, config: DeviceConfig | None = None, context: Any = None) -> None:
        super().__init__(config, context)
        # importing torch_npu adds torch.npu, the "npu" device type and the hccl backend: do it
        # as the device is built, before the process makes tensors or process groups
        npu()

    @classmethod
    def is_available(cls) -> bool:
        if not torch_npu_present():
            return False
        try:
            return bool(npu().is_available()) and npu().device_count() > 0
        except (ImportError, OSError, RuntimeError):
            # torch_npu without its CANN libraries (libhccl.so) fails at import
            return False

    @classmethod
    def worker_env(cls, kind: str) -> dict[str, str]:
        if kind == "trainer":
            # segments that grow instead of fragmenting: micro-batches of varying length
            # allocate very different sizes step after step
            return {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
        # engines keep the default allocator: the sleep modes of vLLM-Ascend and SGLang manage
        # their own memory pools and do not work with expandable segments
        return {}

    @classmethod
    def deterministic_env(cls) -> dict[str, str]:
        # HCCL's reductions (and LCCL's, within a node) in a fixed order
        return {"HCCL_DETERMINISTIC": "true", "LCCL_DETERMINISTIC": "1"}

    def device_count(self) -> int:
        return npu().device_count()

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("npu", local_rank % max(self.device_count(), 1))

    def set_device(self, local_rank: int) -> None:
        npu().set_device(self.torch_device(local_rank))

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        npu().manual_seed_all(seed)

    def rng_state(self) -> dict[str, Any]:
        return {"npu": npu().get_rng_state_all()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "npu" in state:
            npu().set_rng_state_all(state["npu"])

    def synchronize(self) -> None:
        npu().synchronize()

    def empty_cache(self) -> None:
        npu().empty_cache()

    def total_memory(self) -> int | None:
        return int(npu().get_device_properties(0).total_memory)

    def memory_metrics(self) -> dict[str, float]:
        return {
            "perf/max_memory_allocated_gb": npu().max_memory_allocated() / _GIB,
            "perf/max_memory_reserved_gb": npu().max_memory_reserved() / _GIB,
        }
