"""Helpers shared by the reward tests: a character tokenizer and batches in the scheduler's
column layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from plugrl.data.batch import Batch

PAD = 0
EOS = 1  # a special token: decoding must skip it


class CharTokenizer:
    """One token per character (id = code point + 2); ids 0 and 1 are pad and eos."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 2 for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        special = {PAD: "<pad>", EOS: "<eos>"}
        return "".join(
            ("" if skip_special_tokens else special[i]) if i in special else chr(i - 2) for i in ids
        )


def make_batch(
    tokenizer: CharTokenizer,
    texts: Sequence[str],
    data_sources: Sequence[str] | str,
    ground_truths: Sequence[Any],
    *,
    width: int | None = None,
    eos: bool = True,
) -> Batch:
    """Right-padded ``responses`` and ``response_mask`` (an eos token ends each response, as
    generation leaves it) plus the non-tensor columns a reward manager reads."""
    encoded = [tokenizer.encode(t) + ([EOS] if eos else []) for t in texts]
    width = width or max([len(e) for e in encoded] + [1])
    responses = torch.full((len(texts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        ids = ids[:width]
        responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
    if isinstance(data_sources, str):
        data_sources = [data_sources] * len(texts)
    return Batch(
        tensors={"responses": responses, "response_mask": mask},
        columns={
            "data_source": list(data_sources),
            "ground_truth": list(ground_truths),
            "extra_info": [{"index": i} for i in range(len(texts))],
        },
    )
