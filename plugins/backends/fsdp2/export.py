"""Writing full weights as a Hugging Face model folder (config, safetensors, tokenizer files)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

# Files a tokenizer folder may hold; whichever exist are copied next to the weights.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


def write_hf_folder(
    path: Path,
    *,
    model_class: type,
    config: object,
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    source_folders: Iterable[str | None],
) -> None:
    """Build ``model_class`` from ``config`` without allocating, put ``weights`` in it and
    ``save_pretrained`` it to ``path``, then copy the tokenizer files found in
    ``source_folders`` (first folder that has a file wins).

    The folder is written beside ``path`` and renamed into place, so a reader never sees half
    an export; an existing folder at ``path`` is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with torch.device("meta"):
            model = model_class._from_config(config, dtype=dtype)
        state = {name: tensor.to(dtype) for name, tensor in weights}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        tied = set(_tied_names(model))
        missing = [name for name in missing if name not in tied]
        if missing or unexpected:
            raise ValueError(
                f"weights do not match {model_class.__name__}: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )
        model.tie_weights()
        model.config.dtype = dtype
        model.save_pretrained(staging)
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


def _tied_names(model: torch.nn.Module) -> list[str]:
    """Parameter names that ``tie_weights`` fills from another parameter."""
    keys = getattr(model, "all_tied_weights_keys", None) or getattr(
        model, "_tied_weights_keys", None
    )
    if isinstance(keys, dict):
        return list(keys)
    return list(keys or [])
