"""The npu device against a fake torch_npu (fake_ascend.py): torch_npu is never installed here
(it breaks ``import torch`` without Ascend CANN)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import plugrl_npu
from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.run.runner import run_recipe
from plugrl_npu.device import NpuDevice, NpuDeviceConfig
from tests.plugins.devices.npu import fake_ascend


@pytest.fixture
def npu(monkeypatch):
    fake, _ = fake_ascend.install_torch_npu(monkeypatch, count=2)
    return fake


def test_registered_as_npu_with_its_requirement(plugrl_register_plugin, plugrl_plugin_manager):
    plugrl_register_plugin(plugrl_npu)
    entry = plugrl_plugin_manager.registry("devices").get("npu")
    assert entry.requires == ("torch_npu",)
    assert "pip install torch-npu" in entry.install
    assert entry.target == "plugrl_npu.device:NpuDevice"
    assert entry.load_config() is NpuDeviceConfig


def test_the_device_says_how_ranks_are_placed_and_talk():
    assert NpuDevice.name == "npu"
    assert NpuDevice.torch_device_type == "npu"
    assert NpuDevice.dist_backend == "hccl"
    assert NpuDevice.ray_resource == "NPU"
    assert NpuDevice.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert NpuDevice.worker_env("trainer") == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    assert NpuDevice.worker_env("rollout") == {}


def test_without_torch_npu_the_device_is_absent_and_torch_npu_is_not_imported():
    assert "torch_npu" not in sys.modules
    assert NpuDevice.is_available() is False
    assert plugrl_npu.detect_device() is None
    assert "torch_npu" not in sys.modules


def test_with_torch_npu_the_device_drives_torch_npu(npu):
    assert NpuDevice.is_available() is True
    assert plugrl_npu.detect_device() == "npu"
    device = NpuDevice()
    assert device.device_count() == 2
    device.manual_seed(7)
    state = device.rng_state()
    npu.rng_states = [torch.zeros(1, dtype=torch.uint8)] * 2
    device.set_rng_state(state)
    assert [int(s) for s in npu.rng_states] == [0, 1]
    device.synchronize()
    device.empty_cache()
    assert [name for name, _ in npu.calls] == [
        "manual_seed_all",
        "set_rng_state_all",
        "synchronize",
        "empty_cache",
    ]
    assert npu.calls[0] == ("manual_seed_all", (7,))
    assert device.memory_metrics() == {
        "perf/max_memory_allocated_gb": 3.0,
        "perf/max_memory_reserved_gb": 4.0,
    }


def test_torch_devices_are_npu_devices(tmp_path):
    # torch knows the device type "npu" only after torch_npu renames the private backend, which
    # cannot be undone: do it in a process of its own
    script = textwrap.dedent(
        """
        import json, sys
        import pytest
        import torch
        from tests.plugins.devices.npu import fake_ascend
        from plugrl_npu.device import NpuDevice

        fake_ascend.install_torch_npu(pytest.MonkeyPatch(), count=2)
        torch.utils.rename_privateuse1_backend("npu")
        device = NpuDevice()
        # the start-up check of the device's torch type passes once torch_npu registered it
        from plugrl.plugin.build import check_torch_device_type
        from plugrl.plugin.registry import Entry
        check_torch_device_type(Entry("devices", "npu", NpuDevice, "npu"), device)
        device.set_device(3)
        print(json.dumps({
            "devices": [str(device.torch_device(rank)) for rank in range(3)],
            "set": [str(args[0]) for name, args in torch.npu.calls if name == "set_device"],
        }))
        """
    )
    here = Path(__file__).parent
    source = Path(plugrl_npu.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(source)])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {"devices": ["npu:0", "npu:1", "npu:0"], "set": ["npu:1"]}


def test_a_recipe_on_npu_without_torch_npu_stops_with_the_install_line(
    plugrl_register_plugin, plugrl_recipe
):
    plugrl_register_plugin(plugrl_npu)
    with pytest.raises(
        RecipeError,
        match=r"device.name: device 'npu' \(plugin '\w+'\) is installed but cannot run here: it "
        r"needs torch_npu \(pip install torch-npu matching your torch and Ascend CANN",
    ):
        plugrl_recipe({"device": "npu"})


def test_a_run_on_npu_without_npus_says_so(npu, plugrl_register_plugin, plugrl_recipe):
    npu.count = 0
    plugrl_register_plugin(plugrl_npu)
    recipe = plugrl_recipe({"device": "npu"})
    with pytest.raises(RecipeError, match="device 'npu' is not available on this machine"):
        run_recipe(recipe, get_plugin_manager())
