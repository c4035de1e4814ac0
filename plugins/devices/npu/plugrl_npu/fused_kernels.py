"""torch_npu's fused kernels in transformers' Qwen2 and Qwen3 models, for ``actor.backend:
fsdp2`` on ``npu`` (``device.fused_kernels``).

RMSNorm, the SwiGLU MLP and the rotary embedding of these models run as several small
operators in eager PyTorch; on NPU each launch is costly, and torch_npu has one fused operator
for each (``npu_rms_norm``, ``npu_swiglu``, ``npu_rotary_mul``). Same results, fewer launches;
verl applies the same replacements on NPU. The patches replace class methods and a module
function of transformers, so they act on models built after them.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

_MODELS = ("qwen2", "qwen3")
_originals: dict[tuple[Any, str], Any] = {}
"""(class or module, attribute) -> what was there before the patch."""


def _torch_npu() -> Any:
    return importlib.import_module("torch_npu")


def rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return _torch_npu().npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]


def swiglu_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    if getattr(self.config, "hidden_act", "silu") not in ("silu", "swish"):
        return _originals[(type(self), "forward")](self, x)
    gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
    return self.down_proj(_torch_npu().npu_swiglu(gate_up, dim=-1))


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_mul = _torch_npu().npu_rotary_mul
    return (
        rotary_mul(q.contiguous(), cos, sin).to(q.dtype),
        rotary_mul(k.contiguous(), cos, sin).to(k.dtype),
    )


def _replace(owner: Any, attribute: str, new: Any) -> None:
    key = (owner, attribute)
    if key not in _originals:
        _originals[key] = getattr(owner, attribute)
    setattr(owner, attribute, new)


def apply_fused_kernels() -> list[str]:
    """Patch the Qwen2 and Qwen3 modelling code of transformers; one line per model."""
    _torch_npu()  # fail here, naming torch_npu, rather than in the first forward
    lines = []
    for model in _MODELS:
        try:
            modeling = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
        except ImportError:
            continue
        prefix = model.capitalize()
        _replace(getattr(modeling, f"{prefix}RMSNorm"), "forward", rms_norm_forward)
        _replace(getattr(modeling, f"{prefix}MLP"), "forward", swiglu_mlp_forward)
        _replace(modeling, "apply_rotary_pos_emb", apply_rotary_pos_emb)
        lines.append(
            f"transformers {prefix}: RMSNorm -> npu_rms_norm, MLP -> npu_swiglu, "
            "rotary -> npu_rotary_mul"
        )
    return lines


def remove_fused_kernels() -> None:
    """Put back what :func:`apply_fused_kernels` replaced."""
    for (owner, attribute), original in _originals.items():
        setattr(owner, attribute, original)
    _originals.clear()
