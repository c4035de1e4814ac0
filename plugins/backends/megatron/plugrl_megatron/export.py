"""Writing whole weights as a Hugging Face model folder (config, safetensors, tokenizer)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

# Files a tokenizer folder may hold; whichever exist are copied next to the weights.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


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

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        state = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in weights}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config.dtype = dtype
        config.save_pretrained(staging)
        copied: set[str] = set()
        for folder in source_folders:
            if not folder:
                continue
            for name in TOKENIZER_FILES:
                source = Path(folder) / name
                if name not in copied and source.is_file():
                    shutil.copy2(source, staging / name)
                    copied.add(name)
        if path.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            path.rename(retired / path.name)
            staging.rename(path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
