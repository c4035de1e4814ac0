"""Checkpoints of one role: each rank writes its own shards (model chunks, optimizer state,
learning-rate schedule, random state), so a run resumes on the same parallel layout.

Layout of a checkpoint folder::

    megatron_rank_<rank>.pt                    that rank's state
    distributed_optimizer_tp<t>_pp<p>.pt       megatron's distributed optimizer state of one
                                               model shard (with use_distributed_optimizer)
    megatron.json                              role, rank count and parallel sizes, checked
                                               when resuming

Every file is read weights-only (tensors and plain values), so a crafted checkpoint cannot
run code on resume: a file that refers to anything else is refused, named in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plugrl.api import CheckpointError
from plugrl.api.backend import load_weights_only, one_line_cause, raise_if_any_rank_failed

MANIFEST = "megatron.json"
RESUME_FIX = (
    "resume from an earlier global_step_N folder or start fresh with trainer.resume_mode=disable"
)


def rank_file(path: Path, rank: int) -> Path:
    return path / f"megatron_rank_{rank}.pt"


def distributed_optimizer_file(path: Path, model_shard: str) -> Path:
    return path / f"distributed_optimizer_{model_shard}.pt"


def _optimizer_state(optimizer: Any, path: Path, model_shard: str) -> Any:
    if optimizer is None:
        return None
    if hasattr(optimizer, "save_parameter_state"):
        # megatron's distributed optimizer keeps its state sharded over data-parallel ranks;
        # this gathers it into one file per model shard (collective over those ranks)
        optimizer.save_parameter_state(str(distributed_optimizer_file(path, model_shard)))
    return optimizer.state_dict()


def save(
    path: Path,
    *,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    extra_state: dict[str, Any],
    layout: dict[str, Any],
    rank: int,
    model_shard: str,
) -> None:
    """Write this rank's state; ``model_shard`` names its tensor/pipeline-parallel piece
    (the data-parallel copies of one piece share the distributed optimizer's file)."""
    path.mkdir(parents=True, exist_ok=True)
    state = {
        "model": [chunk.state_dict() for chunk in chunks],
        "optimizer": _optimizer_state(optimizer, path, model_shard),
        "extra_state": extra_state,
    }
    target = rank_file(path, rank)
    partial = target.with_suffix(".pt.partial")
    torch.save(state, partial)
    partial.replace(target)
    if rank == 0:
        (path / MANIFEST).write_text(json.dumps(layout, indent=2) + "\n", encoding="utf-8")
    dist.barrier()


def load(
    path: Path,
    *,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    layout: dict[str, Any],
    rank: int,
    model_shard: str,
) -> dict[str, Any]:
    manifest = path / MANIFEST
    try:
        written = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{manifest} is missing or unreadable ({type(exc).__name__}); {RESUME_FIX}"
        ) from exc
    if written != layout:
        changed = sorted(key for key in layout if written.get(key) != layout[key])
        raise CheckpointError(
            f"{path} was written with {', '.join(f'{k}={written.get(k)!r}' for k in changed)}, "
            f"this run has {', '.join(f'{k}={layout[k]!r}' for k in changed)}; the megatron "
            f"backend resumes on the layout it saved with; {RESUME_FIX}"
        )
    uses_shard_file = optimizer is not None and hasattr(optimizer, "load_parameter_state")
    shard_file = distributed_optimizer_file(path, model_shard)
    problem: CheckpointError | None = None
    state: dict[str, Any] = {}
    try:
        state = _read_rank_file(rank_file(path, rank))
        if uses_shard_file and state["optimizer"] is not None and shard_file.exists():
            # megatron reads this file itself with torch.load's default, which the
            # environment (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD) can make unsafe: it is checked
            # here first, its tensors mapped rather than read (a distributed optimizer only
            # writes it; without, megatron reads nothing)
            _read(shard_file, mmap=True)
    except CheckpointError as exc:
        problem = exc
    raise_if_any_rank_failed(problem)
    for chunk, chunk_state in zip(chunks, state["model"], strict=True):
        chunk.load_state_dict(chunk_state)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
        if uses_shard_file:
            optimizer.load_parameter_state(str(shard_file))
    return state["extra_state"]


def _read(file: Path, *, mmap: bool = False) -> Any:
    try:
        return load_weights_only(file, fix=RESUME_FIX, mmap=mmap)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"{file} is missing or corrupt ({one_line_cause(exc)}); {RESUME_FIX}"
        ) from exc


def _read_rank_file(file: Path) -> dict[str, Any]:
    state = _read(file)
    if not isinstance(state, dict) or not {"model", "optimizer", "extra_state"} <= set(state):
        held = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{file} is not a megatron rank file (it holds {held}, not model, optimizer and "
            f"extra_state); {RESUME_FIX}"
        )
    return state
