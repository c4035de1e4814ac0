"""A CPU that Ray places as a GPU, so that a local Ray started with logical GPUs hands out
device ids as it does on a machine of GPUs (the process still computes on the CPU).

Registered in-process by the tests; Ray workers import it by name.
"""

from __future__ import annotations

from typing import ClassVar

import plugrl
from plugrl_cpu.device import CpuDevice


@plugrl.hookimpl
def register_devices(register):
    register("fakegpu", "tests.core.cluster.cluster_fake_gpu:FakeGpuDevice")


class FakeGpuDevice(CpuDevice):
    """The CPU, placed by Ray's ``GPU`` resource and seeing devices as CUDA does."""

    name = "fakegpu"
    torch_device_type = "cpu"
    ray_resource: ClassVar[str | None] = "GPU"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
