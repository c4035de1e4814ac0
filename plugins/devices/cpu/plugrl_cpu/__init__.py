"""The ``cpu`` device: runs anywhere, gloo between ranks; the fallback of ``device: auto``."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_devices(register):
    register("cpu", "plugrl_cpu.device:CpuDevice")


@hookimpl(trylast=True)
def detect_device():
    return "cpu"
