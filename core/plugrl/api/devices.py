"""The device interface: an accelerator (or the CPU) as a run uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.parts.device import Device, DeviceConfig, resolve_device_name

__all__ = [
    "Device",
    "DeviceConfig",
    "resolve_device_name",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "Device": ("plugrl.parts.device", "Device"),
        "DeviceConfig": ("plugrl.parts.device", "DeviceConfig"),
        "resolve_device_name": ("plugrl.parts.device", "resolve_device_name"),
    },
)
