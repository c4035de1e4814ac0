"""Qwen2-VL and Qwen2.5-VL for plugrl: the processor (loaded, or assembled from the tokenizer
and the PIL image processor where ``AutoProcessor`` cannot load), the image placeholder text,
the image token ids and the model's own M-RoPE position ids (docs/vision.md)."""

from __future__ import annotations

from typing import Any

from plugrl.api import hookimpl

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The Hugging Face model types this plugin answers for."""


@hookimpl
def multimodal_model(model_type: str) -> Any:
    if model_type in MODEL_TYPES:
        from plugrl_qwen2_vl.family import Qwen2VLFamily

        return Qwen2VLFamily
    return None
