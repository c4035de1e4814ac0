"""Writing whole weights as a Hugging Face model folder (config, safetensors, tokenizer)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from plugrl.api.backend import copy_tokenizer_files, staged_folder


def write_hf_folder(
    path: Path,
    *,
    config: Any,
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    source_folders: Iterable[str | None],
) -> None:
    """Write ``config`` and ``weights`` (Hugging Face names) as ``model.safetensors`` under
    ``path``, with the tokenizer files found in ``source_folders`` (first folder wins).

    The folder is written beside ``path`` and renamed into place, so a reader never sees half
    an export; an existing folder at ``path`` is replaced.
    """
    from safetensors.torch import save_file

    with staged_folder(path) as staging:
        state = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in weights}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config.dtype = dtype
        config.save_pretrained(staging)
        copy_tokenizer_files(staging, source_folders)
