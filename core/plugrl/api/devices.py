"""The device interface: an accelerator (or the CPU) as a run uses it."""

from plugrl.parts.device import Device, DeviceConfig, resolve_device_name

__all__ = ["Device", "DeviceConfig", "resolve_device_name"]
