"""Stand-ins for torch_npu and MindSpeed (with the bit of Megatron it patches), for contract
tests of plugrl-npu. Neither library can be installed here: torch-npu breaks ``import torch``
without Ascend CANN, and MindSpeed comes from Ascend's repository.

``install_torch_npu`` puts a fake ``torch_npu`` in ``sys.modules`` and a fake ``torch.npu``
on torch, with the functions plugrl-npu calls (the names and signatures of torch_npu's
``torch.npu`` and of its fused operators, computed here with plain torch). ``write_mindspeed``
writes a fake ``mindspeed`` and ``megatron`` as files, because what matters is what happens
when ``mindspeed.megatron_adaptor`` is *imported*: it records the ``sys.argv`` it saw and
whether Megatron was imported before it, registers a patch of
``megatron.core.parallel_state.initialize_model_parallel`` and applies it. Its ``repatch(args)``
behaves as MindSpeed's, or, with ``FAKE_MINDSPEED_REPATCH`` set, as a broken one: ``drops``
(removes the patches and applies none, the silent regression), ``ignores-args`` (re-applies
without the arguments) or ``one-idle`` (leaves one registered patch unapplied).
"""

from __future__ import annotations

import sys
import textwrap
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

GIB = 1024**3


class FakeNpu:
    """What ``import torch_npu`` adds as ``torch.npu``: the calls plugrl-npu makes."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.calls: list[tuple[str, tuple]] = []
        self.rng_states = [torch.tensor([index], dtype=torch.uint8) for index in range(count)]

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, device: Any) -> None:
        self._record("set_device", device)

    def manual_seed_all(self, seed: int) -> None:
        self._record("manual_seed_all", seed)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [state.clone() for state in self.rng_states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self._record("set_rng_state_all", len(states))
        self.rng_states = [state.clone() for state in states]

    def synchronize(self) -> None:
        self._record("synchronize")

    def empty_cache(self) -> None:
        self._record("empty_cache")

    def max_memory_allocated(self) -> int:
        return 3 * GIB

    def max_memory_reserved(self) -> int:
        return 4 * GIB


class FusedKernels:
    """torch_npu's fused operators, computed with plain torch; calls are counted."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"npu_rms_norm": 0, "npu_swiglu": 0, "npu_rotary_mul": 0}

    def npu_rms_norm(
        self, x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls["npu_rms_norm"] += 1
        variance = x.float().pow(2).mean(-1, keepdim=True)
        rstd = torch.rsqrt(variance + epsilon)
        return gamma * (x.float() * rstd).to(x.dtype), rstd

    def npu_swiglu(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls["npu_swiglu"] += 1
        gate, up = x.chunk(2, dim=dim)
        return F.silu(gate) * up

    def npu_rotary_mul(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        self.calls["npu_rotary_mul"] += 1
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def _module(name: str, **attributes: Any) -> types.ModuleType:
    made = types.ModuleType(name)
    made.__spec__ = ModuleSpec(name, None, is_package=True)
    made.__dict__.update(attributes)
    return made


def install_torch_npu(monkeypatch: Any, count: int = 2) -> tuple[FakeNpu, FusedKernels]:
    """Fake ``torch_npu`` (and ``torch.npu``) for one test."""
    npu, kernels = FakeNpu(count), FusedKernels()
    transfer = _module("torch_npu.contrib.transfer_to_npu")
    contrib = _module("torch_npu.contrib", transfer_to_npu=transfer)
    torch_npu = _module(
        "torch_npu",
        __version__="2.7.1.fake",
        npu=npu,
        contrib=contrib,
        npu_rms_norm=kernels.npu_rms_norm,
        npu_swiglu=kernels.npu_swiglu,
        npu_rotary_mul=kernels.npu_rotary_mul,
    )
    for made in (torch_npu, contrib, transfer):
        monkeypatch.setitem(sys.modules, made.__name__, made)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return npu, kernels


_FILES = {
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "",
    "megatron/core/parallel_state.py": """
        def initialize_model_parallel(**sizes):
            return "megatron"
    """,
    "mindspeed/__init__.py": '__version__ = "0.12.1.fake"\n',
    "mindspeed/args_utils.py": """
        from types import SimpleNamespace

        _ARGS = SimpleNamespace()


        def get_mindspeed_args(get_defaults=False):
            return _ARGS
    """,
    "mindspeed/patch_utils.py": """
        import importlib


        class Patch:
            def __init__(self, orig_func_name, new_func):
                self.orig_module_name, self.orig_func_name = orig_func_name.rsplit(".", 1)
                self.patch_func = new_func
                self.orig_func = None
                self.is_applied = False

            def apply_patch(self):
                module = importlib.import_module(self.orig_module_name)
                if self.orig_func is None:
                    self.orig_func = getattr(module, self.orig_func_name)
                setattr(module, self.orig_func_name, self.patch_func)
                self.is_applied = True

            def remove_patch(self):
                if self.is_applied:
                    module = importlib.import_module(self.orig_module_name)
                    setattr(module, self.orig_func_name, self.orig_func)
                self.is_applied = False


        class MindSpeedPatchesManager:
            patches_info = {}

            @staticmethod
            def register_patch(orig_func_name, new_func=None, force_patch=False,
                               create_dummy=False):
                MindSpeedPatchesManager.patches_info[orig_func_name] = Patch(
                    orig_func_name, new_func)

            @staticmethod
            def apply_patches():
                for patch in MindSpeedPatchesManager.patches_info.values():
                    patch.apply_patch()

            @staticmethod
            def remove_patches():
                for patch in MindSpeedPatchesManager.patches_info.values():
                    patch.remove_patch()
    """,
    "mindspeed/megatron_adaptor.py": """
        import os
        import sys

        SEEN = {
            "argv": list(sys.argv),
            "megatron_first": any(m.split(".")[0] == "megatron" for m in sys.modules),
            "torch_npu_first": "torch_npu" in sys.modules,
        }
        from torch_npu.contrib import transfer_to_npu  # noqa: F401  (as MindSpeed does)

        from mindspeed import args_utils
        from mindspeed.patch_utils import MindSpeedPatchesManager as aspm

        REPATCH_CALLS = []


        def initialize_model_parallel(**sizes):
            return "mindspeed"


        def patch_features():
            aspm.register_patch(
                "megatron.core.parallel_state.initialize_model_parallel",
                initialize_model_parallel,
            )
            aspm.apply_patches()


        def repatch(args):
            REPATCH_CALLS.append(dict(args))
            mode = os.environ.get("FAKE_MINDSPEED_REPATCH", "")
            aspm.remove_patches()
            if mode == "drops":
                return
            if mode != "ignores-args":
                for key, value in args.items():
                    setattr(args_utils._ARGS, key, value)
            if mode == "one-idle":
                aspm.register_patch("megatron.core.parallel_state.unused", None)
                aspm.patches_info["megatron.core.parallel_state.initialize_model_parallel"
                                  ].apply_patch()
                return
            aspm.apply_patches()


        patch_features()
    """,
}


def write_mindspeed(folder: Path) -> Path:
    """Write the fake ``mindspeed`` and ``megatron`` packages under ``folder``."""
    for relative, text in _FILES.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return folder
