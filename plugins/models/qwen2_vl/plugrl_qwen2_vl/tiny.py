"""A tiny Qwen2.5-VL-architecture model, built here from a seed: nothing is downloaded.

:func:`save_tiny_vl_model` writes a folder with the quickstart's byte-level tokenizer
(:func:`plugrl.testing.make_tiny_tokenizer`) plus the vision special tokens, a freshly
initialised ``Qwen2_5_VLForConditionalGeneration`` (a two-layer language model and a two-block
vision tower, about 180k parameters with the default tokenizer) and the PIL image processor's
``preprocessor_config.json``, sized so that a 56 x 56 image is 4 tokens. The same arguments
write the same files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plugrl_qwen2_vl.family import VISION_TOKENS

PATCH_SIZE = 14
MERGE_SIZE = 2
MIN_PIXELS = 28 * 28
"""The image processor's smallest area: one merged patch (one image token)."""
MAX_PIXELS = 112 * 112
"""The image processor's largest area: 16 image tokens; larger images are scaled down."""


def make_tiny_vl_tokenizer(texts: Iterable[str] | None = None, *, vocab_size: int = 512) -> Any:
    """:func:`plugrl.testing.make_tiny_tokenizer` of ``texts`` and ``vocab_size``, with the
    Qwen2-VL vision tokens (:data:`VISION_TOKENS`) added as special tokens after its
    vocabulary."""
    from plugrl.testing import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    return tokenizer


def make_tiny_vl_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    weight_std: float | None = None,
    dtype: str = "float32",
) -> Any:
    """A freshly initialised ``Qwen2_5_VLForConditionalGeneration`` whose vocabulary is
    ``len(tokenizer)`` and whose image, video and vision start/end token ids are the
    tokenizer's; the same arguments give the same weights, and the process's random state is
    left as it was. ``weight_std`` re-draws every weight matrix from a normal distribution of
    that spread and adds noise of that spread to every vector (as
    :func:`plugrl.testing.make_tiny_model` does), so that responses vary with the image."""
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from plugrl.testing import spread_weights

    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    head_dim = hidden_size // num_attention_heads
    # M-RoPE splits each head's rotary frequencies over time, height and width in Qwen2-VL's
    # proportions (2:3:3, [16, 24, 24] at head size 128)
    spatial = head_dim // 2 * 3 // 8
    mrope_section = [head_dim // 2 - 2 * spatial, spatial, spatial]
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_section,
            },
            "tie_word_embeddings": True,
            "attention_dropout": 0.0,
            "bos_token_id": None,
            "eos_token_id": eos,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "window_size": 2 * PATCH_SIZE * MERGE_SIZE,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        image_token_id=token_ids["<|image_pad|>"],
        video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=getattr(torch, dtype))
    if weight_std is not None:
        spread_weights(model, weight_std, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


def make_tiny_image_processor(*, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> Any:
    """The Qwen2-VL image processor (PIL backend) with the tiny model's patch and merge sizes,
    and images scaled to between ``min_pixels`` and ``max_pixels``."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    )


def save_tiny_vl_model(
    folder: str | Path,
    *,
    seed: int = 0,
    texts: Iterable[str] | None = None,
    tokenizer_vocab_size: int = 512,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    **model_options: Any,
) -> Path:
    """Write the tiny vision-language model to ``folder`` (created if needed) and return its
    path: :func:`make_tiny_vl_tokenizer` of ``texts`` and ``tokenizer_vocab_size``,
    :func:`make_tiny_vl_model` of that tokenizer, ``seed`` and ``model_options``, and
    :func:`make_tiny_image_processor`'s config. The same arguments write the same files."""
    tokenizer = make_tiny_vl_tokenizer(texts, vocab_size=tokenizer_vocab_size)
    model = make_tiny_vl_model(tokenizer, seed=seed, **model_options)
    path = Path(folder)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    make_tiny_image_processor(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(path)
    return path
