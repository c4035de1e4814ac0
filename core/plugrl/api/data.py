"""The batch a run passes between parts, and the tokenizer and dataset helpers plugins share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.data.batch import (
        IMAGES_COLUMN,
        MULTIMODAL_COLUMN,
        VIDEOS_COLUMN,
        Batch,
        left_pad,
        response_attention_mask,
    )
    from plugrl.data.dataset import PromptLoader, collate, load_tokenizer, truncate
    from plugrl.data.hf_loading import quiet_hf_loading
    from plugrl.data.multimodal import (
        IMAGE_PLACEHOLDER,
        VIDEO_PLACEHOLDER,
        MultimodalModel,
        decode_image,
        model_inputs,
        multimodal_family,
    )
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.data.video import frames_of

__all__ = [
    "IMAGES_COLUMN",
    "IMAGE_PLACEHOLDER",
    "MULTIMODAL_COLUMN",
    "VIDEOS_COLUMN",
    "VIDEO_PLACEHOLDER",
    "Batch",
    "MultimodalModel",
    "PromptLoader",
    "build_rollout_batch",
    "collate",
    "decode_image",
    "frames_of",
    "left_pad",
    "load_tokenizer",
    "model_inputs",
    "multimodal_family",
    "quiet_hf_loading",
    "response_attention_mask",
    "truncate",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "Batch": ("plugrl.data.batch", "Batch"),
        "IMAGES_COLUMN": ("plugrl.data.batch", "IMAGES_COLUMN"),
        "IMAGE_PLACEHOLDER": ("plugrl.data.multimodal", "IMAGE_PLACEHOLDER"),
        "MULTIMODAL_COLUMN": ("plugrl.data.batch", "MULTIMODAL_COLUMN"),
        "VIDEOS_COLUMN": ("plugrl.data.batch", "VIDEOS_COLUMN"),
        "VIDEO_PLACEHOLDER": ("plugrl.data.multimodal", "VIDEO_PLACEHOLDER"),
        "frames_of": ("plugrl.data.video", "frames_of"),
        "MultimodalModel": ("plugrl.data.multimodal", "MultimodalModel"),
        "decode_image": ("plugrl.data.multimodal", "decode_image"),
        "model_inputs": ("plugrl.data.multimodal", "model_inputs"),
        "multimodal_family": ("plugrl.data.multimodal", "multimodal_family"),
        "PromptLoader": ("plugrl.data.dataset", "PromptLoader"),
        "build_rollout_batch": ("plugrl.data.rollout_batch", "build_rollout_batch"),
        "collate": ("plugrl.data.dataset", "collate"),
        "left_pad": ("plugrl.data.batch", "left_pad"),
        "load_tokenizer": ("plugrl.data.dataset", "load_tokenizer"),
        "quiet_hf_loading": ("plugrl.data.hf_loading", "quiet_hf_loading"),
        "response_attention_mask": ("plugrl.data.batch", "response_attention_mask"),
        "truncate": ("plugrl.data.dataset", "truncate"),
    },
)
