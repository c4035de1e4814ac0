"""How many tokens :mod:`plugrl.algorithms.token_log_probs` takes at a time, without torch, so
that the memory plan counts the same chunk the training code runs."""

from __future__ import annotations

CHUNK_ELEMENTS = 32 * 2**20
"""Logits per chunk (``tokens x vocabulary``): each float32 buffer of a chunk is 128 MiB at
most, 220 tokens at a 152k vocabulary."""


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk at ``vocab_size``: :data:`CHUNK_ELEMENTS` logits, at least one token."""
    return max(1, CHUNK_ELEMENTS // max(vocab_size, 1))
