"""plugrl-npu: the ``npu`` device (Ascend NPUs through torch_npu) and the patches NPU runs
need, applied by ``prepare_backend`` before the training backend imports its framework:
MindSpeed for ``megatron``, torch_npu's fused kernels for ``fsdp2``.

This module only registers; torch_npu and MindSpeed are imported when a run uses the device.
"""

from __future__ import annotations

from plugrl.api import hookimpl

INSTALL = (
    "pip install torch-npu matching your torch and Ascend CANN; see "
    "plugins/devices/npu/README.md in plugrl's repository"
)


@hookimpl
def register_devices(register):
    register(
        "npu",
        "plugrl_npu.device:NpuDevice",
        config="plugrl_npu.device:NpuDeviceConfig",
        requires=["torch_npu"],
        install=INSTALL,
        description="Ascend NPUs through torch_npu; hccl between ranks; Ray resource NPU",
    )


@hookimpl
def detect_device():
    from plugrl_npu.device import NpuDevice, torch_npu_present

    # asked before torch_npu is imported: answer without importing it where it is absent
    return "npu" if torch_npu_present() and NpuDevice.is_available() else None


@hookimpl
def prepare_backend(device, backend, recipe):
    if device != "npu":
        return None
    if backend == "megatron":
        from plugrl_npu.mindspeed import apply_mindspeed

        return apply_mindspeed(recipe)
    if backend == "fsdp2":
        if not getattr(recipe.device, "fused_kernels", True):
            return ["torch_npu fused kernels off (device.fused_kernels: false)"]
        from plugrl_npu.fused_kernels import apply_fused_kernels

        return apply_fused_kernels()
    return None
