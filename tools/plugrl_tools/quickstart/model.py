"""The quickstart's tokenizer and policies, made by plugrl's tiny-model builders
(:mod:`plugrl.testing.tiny`) with the quickstarts' sizes pinned here, so that the builders'
defaults can change without changing a quickstart's model and so its results for a seed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TOOL_MODEL_SIZES: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
"""The tool quickstart's model: a Qwen2-architecture model of about 4M parameters (with the
512-token vocabulary), 4 query heads sharing 2 KV heads, tied embeddings."""

QUICKSTART_MODEL_SIZES: dict[str, Any] = {**TOOL_MODEL_SIZES, "num_hidden_layers": 2}
"""The addition quickstart's model: the tool model's width in 2 layers, about 2M parameters.
Its warm start ends sharper than the 4-layer model's in two thirds of the time (a loss of 0.028
against 0.044 on the same examples, 97% against 91% greedy accuracy on problems that do not
carry), and the sharper it is, the less of each reinforcement-learning update goes to noise in
tokens other than the carry."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> Any:
    """A byte-level BPE trained on ``texts``, saved as a ``Qwen2Tokenizer`` with a ChatML chat
    template; ``<|im_end|>`` is the eos token and ``<|endoftext|>`` pads."""
    from plugrl.testing import make_tiny_tokenizer

    return make_tiny_tokenizer(texts, vocab_size=vocab_size)


def build_tiny_model(
    tokenizer: Any, seed: int, sizes: Mapping[str, Any] = QUICKSTART_MODEL_SIZES
) -> Any:
    """A freshly initialised float32 model of ``sizes`` whose vocabulary is exactly the
    tokenizer's, so it never samples an id the tokenizer cannot decode (same seed, same
    weights)."""
    from plugrl.testing import make_tiny_model

    return make_tiny_model(tokenizer, seed=seed, dtype="float32", **sizes)
