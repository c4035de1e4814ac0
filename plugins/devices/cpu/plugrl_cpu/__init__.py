"""The ``cpu`` device: runs anywhere, gloo between ranks; the fallback of ``device: auto``."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_devices(register):
    register("cpu", "plugrl_cpu.device:CpuDevice")


@plugrl.hookimpl(trylast=True)
def detect_device():
    return "cpu"
