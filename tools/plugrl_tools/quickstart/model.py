"""The quickstart policy: a Qwen2-architecture model of about 4M parameters."""

from __future__ import annotations

from typing import Any


def tiny_qwen2_config(tokenizer: Any) -> Any:
    """Hidden 256, 4 layers, 4 query heads sharing 2 KV heads, tied embeddings; the vocabulary
    is exactly the tokenizer's, so the model never samples an id the tokenizer cannot decode."""
    from transformers import Qwen2Config

    eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    pad_id = tokenizer.pad_token_id
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def build_tiny_model(tokenizer: Any, seed: int) -> Any:
    """A freshly initialised float32 model (same seed, same weights)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = tiny_qwen2_config(tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # generation stops at <|im_end|> (the chat turn's end) or <|endoftext|>
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    return model
