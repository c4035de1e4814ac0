"""The ``cuda`` device: NVIDIA GPUs through torch.cuda, nccl between ranks."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_devices(register):
    register("cuda", "plugrl_cuda.device:CudaDevice")


@hookimpl
def detect_device():
    from plugrl_cuda.device import CudaDevice

    return "cuda" if CudaDevice.is_available() else None
