"""``trainer.full_determinism``: what it sets in a process of the run (a fresh interpreter
building its device as every worker does), what it leaves alone, and what it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from plugrl.errors import RecipeError

# every variable a device may set for determinism, removed from the probe's environment
DETERMINISM_ENV = (
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_ALGO",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "FLASH_ATTENTION_DETERMINISTIC",
    "HCCL_DETERMINISTIC",
    "LCCL_DETERMINISTIC",
    "MKL_CBWR",
)

PROBE = """
import json, os, sys
import attrs
import torch
from plugrl.cluster.worker import build_device
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import Recipe

def state():
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "env": {key: os.environ.get(key) for key in sys.argv[1:]},
    }

def build(device_name, on):
    recipe = Recipe()
    recipe = attrs.evolve(recipe, trainer=attrs.evolve(recipe.trainer, full_determinism=on))
    build_device(get_plugin_manager(), device_name, recipe)
    return state()

torch.backends.cudnn.benchmark = True  # what a process may have had before
print(json.dumps({
    "off": build("cuda", False),
    "cpu": build("cpu", True),
    "cuda": build("cuda", True),
}))
"""


@pytest.fixture(scope="module")
def probed() -> dict:
    """In a fresh interpreter, as every process of a run does: the cuda device built for a run
    without the option, then the cpu and the cuda devices for a run with it (no GPU is
    touched), the state after each; the user set ``CUBLAS_WORKSPACE_CONFIG`` themselves."""
    clean = {k: v for k, v in os.environ.items() if k not in DETERMINISM_ENV}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *DETERMINISM_ENV],
        env={**clean, "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


NOTHING_SET = dict.fromkeys(DETERMINISM_ENV) | {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


def test_without_the_option_nothing_is_changed(probed):
    assert probed["off"]["deterministic"] is False
    assert probed["off"]["cudnn_benchmark"] is True
    assert probed["off"]["env"] == NOTHING_SET


def test_a_cpu_process_of_a_deterministic_run_refuses_nondeterministic_algorithms(probed):
    state = probed["cpu"]
    assert state["deterministic"] is True and state["warn_only"] is False
    assert state["env"] == NOTHING_SET | {"MKL_CBWR": "AUTO"}


def test_a_cuda_process_gets_the_cublas_cudnn_nccl_and_attention_settings(probed):
    state = probed["cuda"]
    assert state["deterministic"] is True and state["warn_only"] is False
    assert state["cudnn_deterministic"] is True and state["cudnn_benchmark"] is False
    assert state["env"] == NOTHING_SET | {
        "MKL_CBWR": "AUTO",
        "NCCL_ALGO": "Ring,Tree",
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
        "FLASH_ATTENTION_DETERMINISTIC": "1",
    }  # the user's CUBLAS_WORKSPACE_CONFIG (also a deterministic one) is kept


def test_the_npu_device_asks_for_deterministic_collectives():
    from plugrl_npu.device import NpuDevice

    assert NpuDevice.deterministic_env() == {
        "HCCL_DETERMINISTIC": "true",
        "LCCL_DETERMINISTIC": "1",
    }


def test_a_fully_async_run_cannot_be_deterministic(sim_task, tmp_path, plugrl_recipe):
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.run.runner import run_recipe
    from plugrl_sim.parts import sim_recipe

    data = sim_recipe(sim_task, tmp_path / "run", scheduler="fully_async", colocate=False)
    data["trainer"]["full_determinism"] = True
    with pytest.raises(RecipeError) as info:
        run_recipe(plugrl_recipe(data), get_plugin_manager())
    assert str(info.value) == (
        "trainer.full_determinism: scheduler fully_async cannot be deterministic: which "
        "samples each step trains, and with which weights they were generated, depend on when "
        "the engines finish them; set trainer.full_determinism=false or scheduler=sync"
    )
    assert not (tmp_path / "run").exists()  # stopped before the run wrote anything
