"""The quickstart's tokenizer and policy, made by plugrl's tiny-model builders
(:mod:`plugrl.testing.tiny`) with the quickstart's sizes pinned here, so that the builders'
defaults can change without changing the quickstart's model and so its results for a seed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

QUICKSTART_MODEL_SIZES: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
"""A Qwen2-architecture model of about 4M parameters (with the 512-token vocabulary): 4 query
heads sharing 2 KV heads, tied embeddings."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> Any:
    """A byte-level BPE trained on ``texts``, saved as a ``Qwen2Tokenizer`` with a ChatML chat
    template; ``<|im_end|>`` is the eos token and ``<|endoftext|>`` pads."""
    from plugrl.testing import make_tiny_tokenizer

    return make_tiny_tokenizer(texts, vocab_size=vocab_size)


def build_tiny_model(tokenizer: Any, seed: int) -> Any:
    """A freshly initialised float32 model whose vocabulary is exactly the tokenizer's, so it
    never samples an id the tokenizer cannot decode (same seed, same weights)."""
    from plugrl.testing import make_tiny_model

    return make_tiny_model(tokenizer, seed=seed, dtype="float32", **QUICKSTART_MODEL_SIZES)
