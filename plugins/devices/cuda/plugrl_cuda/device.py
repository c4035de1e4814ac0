"""NVIDIA GPUs as a device."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from plugrl.api.devices import Device

_GIB = 1024**3


class CudaDevice(Device):
    """One GPU per rank; collectives use nccl; Ray places ranks by the ``GPU`` resource."""

    name: ClassVar[str] = "cuda"
    dist_backend: ClassVar[str] = "nccl"
    ray_resource: ClassVar[str | None] = "GPU"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    kubernetes_resource: ClassVar[str | None] = "nvidia.com/gpu"
    slurm_gres: ClassVar[str | None] = "gpu"

    @classmethod
    def network_env(cls, interface: str) -> dict[str, str]:
        return {**super().network_env(interface), "NCCL_SOCKET_IFNAME": interface}

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0

    def device_count(self) -> int:
        return torch.cuda.device_count()

    @classmethod
    def worker_env(cls, kind: str) -> dict[str, str]:
        if kind == "trainer":
            # segments that grow instead of fragmenting: micro-batches of varying length
            # allocate very different sizes step after step
            return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        # engines keep the default allocator: vLLM's sleep mode refuses expandable segments;
        # NCCL's cuMem buffers would survive an engine's sleep and hold memory training needs
        return {"NCCL_CUMEM_ENABLE": "0"}

    @classmethod
    def deterministic_env(cls) -> dict[str, str]:
        return {
            # cuBLAS picks its reduction split by the workspace it has; a fixed workspace per
            # stream makes a product sum in one order (torch refuses a cuBLAS call without it
            # once deterministic algorithms are on)
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            # NVLink SHARP (NVLS) reduces inside the switch, in no fixed order; ring and tree
            # sum in a fixed order for a fixed number of ranks
            "NCCL_ALGO": "Ring,Tree",
            # Transformer Engine (the megatron backend) keeps to its deterministic kernels
            "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
            # transformers' flash_attention_2 passes deterministic=True to flash-attn, whose
            # backward otherwise adds the query gradients up with atomics
            "FLASH_ATTENTION_DETERMINISTIC": "1",
        }

    def make_deterministic(self) -> None:
        torch.backends.cudnn.deterministic = True
        # benchmarking picks the fastest convolution by timing, which may differ run to run
        torch.backends.cudnn.benchmark = False

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))

    def set_device(self, local_rank: int) -> None:
        torch.cuda.set_device(self.torch_device(local_rank))

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def rng_state(self) -> dict[str, Any]:
        return {"cuda": torch.cuda.get_rng_state_all()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "cuda" in state:
            torch.cuda.set_rng_state_all(state["cuda"])

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def total_memory(self) -> int | None:
        return int(torch.cuda.get_device_properties(0).total_memory)

    def memory_metrics(self) -> dict[str, float]:
        return {
            "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated() / _GIB,
            "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved() / _GIB,
        }
