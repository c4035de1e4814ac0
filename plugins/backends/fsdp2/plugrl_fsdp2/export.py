"""Writing full weights as a Hugging Face model folder (config, safetensors, tokenizer files)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from plugrl.api.backend import copy_tokenizer_files, staged_folder
from plugrl.api.data import quiet_hf_loading


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
    with staged_folder(path) as staging:
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
        with quiet_hf_loading():
            model.save_pretrained(staging)
        copy_tokenizer_files(staging, source_folders)


def _tied_names(model: torch.nn.Module) -> list[str]:
    """Parameter names that ``tie_weights`` fills from another parameter."""
    keys = getattr(model, "all_tied_weights_keys", None) or getattr(
        model, "_tied_weights_keys", None
    )
    if isinstance(keys, dict):
        return list(keys)
    return list(keys or [])
