"""The cpu and cuda device plugins; torch.cuda is faked where this machine has no GPU."""

from __future__ import annotations

import pytest
import torch

from plugrl_cpu.device import CpuDevice
from plugrl_cuda.device import CudaDevice

GIB = 1024**3


def test_cpu_and_cuda_are_torch_device_types_of_their_names():
    assert (CpuDevice.torch_device_type, CudaDevice.torch_device_type) == ("cpu", "cuda")


def test_the_cpu_device():
    device = CpuDevice()
    assert (device.name, device.dist_backend, device.ray_resource) == ("cpu", "gloo", None)
    assert CpuDevice.is_available() and device.device_count() >= 1
    assert device.torch_device(3) == torch.device("cpu")
    device.manual_seed(5)
    first = torch.rand(3)
    device.manual_seed(5)
    assert torch.equal(first, torch.rand(3))
    assert device.rng_state() == {}
    assert device.memory_metrics()["perf/cpu_memory_used_gb"] > 0.01


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda with two GPUs that records what is asked of it."""
    calls: list[tuple] = []
    fakes = {
        "is_available": lambda: True,
        "device_count": lambda: 2,
        "set_device": lambda device: calls.append(("set_device", device)),
        "manual_seed_all": lambda seed: calls.append(("manual_seed_all", seed)),
        "get_rng_state_all": lambda: [torch.tensor([1, 2], dtype=torch.uint8)],
        "set_rng_state_all": lambda states: calls.append(("set_rng_state_all", states)),
        "synchronize": lambda: calls.append(("synchronize",)),
        "empty_cache": lambda: calls.append(("empty_cache",)),
        "max_memory_allocated": lambda: 2 * GIB,
        "max_memory_reserved": lambda: 3 * GIB,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    return calls


def test_the_cuda_device_drives_torch_cuda(fake_cuda):
    device = CudaDevice()
    assert (device.name, device.dist_backend, device.ray_resource) == ("cuda", "nccl", "GPU")
    assert device.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert CudaDevice.is_available() and device.device_count() == 2
    # a local rank beyond the visible GPUs wraps around, as under CUDA_VISIBLE_DEVICES
    assert device.torch_device(3) == torch.device("cuda", 1)
    device.set_device(1)
    device.manual_seed(7)
    state = device.rng_state()
    device.set_rng_state(state)
    device.set_rng_state({})  # a checkpoint written on another device has no cuda state
    device.synchronize()
    device.empty_cache()
    # torch.manual_seed seeds every GPU too, so the seed may arrive more than once
    assert ("manual_seed_all", 7) in fake_cuda
    assert [call for call in fake_cuda if call[0] != "manual_seed_all"] == [
        ("set_device", torch.device("cuda", 1)),
        ("set_rng_state_all", state["cuda"]),
        ("synchronize",),
        ("empty_cache",),
    ]
    assert device.memory_metrics() == {
        "perf/max_memory_allocated_gb": 2.0,
        "perf/max_memory_reserved_gb": 3.0,
    }


def test_cuda_is_detected_only_when_present(monkeypatch, plugrl_plugin_manager):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plugrl_plugin_manager.hook.detect_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert plugrl_plugin_manager.hook.detect_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert plugrl_plugin_manager.hook.detect_device() == "cpu"
