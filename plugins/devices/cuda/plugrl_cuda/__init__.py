"""The ``cuda`` device: NVIDIA GPUs through torch.cuda, nccl between ranks."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_devices(register):
    register("cuda", "plugrl_cuda.device:CudaDevice")


@plugrl.hookimpl
def detect_device():
    from plugrl_cuda.device import CudaDevice

    return "cuda" if CudaDevice.is_available() else None
