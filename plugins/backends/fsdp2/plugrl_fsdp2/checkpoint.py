"""Checkpoints of one role: sharded model and optimizer state through torch.distributed.checkpoint
(so a run can resume on a different number of ranks), plus one small file per rank with the
learning-rate schedule and random-generator states.

Layout of a checkpoint folder::

    .metadata, __<rank>_0.distcp    model and optimizer shards (torch.distributed.checkpoint)
    extra_state_rank_<rank>.pt       LR schedule, RNG states, update counter of that rank
    fsdp2.json                       role and rank count, for error messages

Reading one runs no code from it: torch's reader unpickles ``.metadata`` and the non-tensor
entries of the ``.distcp`` files (an optimizer's hyper-parameters) as any pickle, so
:class:`PlainDataReader` reads the first with an unpickler that knows exactly the classes
torch writes there, and :class:`PlainDataLoadPlanner` the entries weights-only, as
``extra_state_rank_<rank>.pt`` is read; a file that refers to anything else is refused.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from plugrl.api import CheckpointError
from plugrl.api.backend import (
    load_weights_only,
    one_line_cause,
    raise_if_any_rank_failed,
    refused_file_error,
)
from plugrl_fsdp2.optim import initialize_optimizer_state

FORMAT_VERSION = 1
MANIFEST = "fsdp2.json"
RESUME_FIX = (
    "resume from an earlier global_step_N folder or start fresh with trainer.resume_mode=disable"
)


def extra_state_file(path: Path, rank: int) -> Path:
    return path / f"extra_state_rank_{rank}.pt"


def _written_by(path: Path) -> int | None:
    """How many ranks wrote the checkpoint, as its manifest says (``None`` if unreadable)."""
    try:
        return int(json.loads((path / MANIFEST).read_text(encoding="utf-8"))["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _extra_state_to_read(path: Path, rank: int) -> Path:
    """The extra-state file ``rank`` resumes from. A rank beyond those that wrote the checkpoint
    (resuming on more ranks) reads rank 0's: the learning-rate schedule and the update count
    are the same on every rank, and no other rank's random state would be more right."""
    writers = _written_by(path)
    if writers is not None and rank >= writers:
        return extra_state_file(path, 0)
    return extra_state_file(path, rank)


@cache
def _metadata_globals() -> dict[tuple[str, str], Any]:
    """The classes and functions a ``.metadata`` file refers to, by (module, name): torch's
    checkpoint metadata classes, ``torch.Size``, dtypes and layouts, the checkpoint's path."""
    allowed: list[Any] = [
        dcp_metadata.Metadata,
        dcp_metadata.MetadataIndex,
        dcp_metadata.StorageMeta,
        dcp_metadata.TensorProperties,
        dcp_metadata.TensorStorageMetadata,
        dcp_metadata.BytesStorageMetadata,
        dcp_metadata.ChunkStorageMetadata,
        dcp_metadata._MEM_FORMAT_ENCODING,
        _StorageInfo,
        torch.Size,
        torch.serialization._get_layout,  # a layout by its name
        pathlib.PosixPath,
        pathlib.WindowsPath,
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
    ]
    named = {(item.__module__, item.__qualname__): item for item in allowed}
    dtypes = {
        ("torch", name): value
        for name, value in vars(torch).items()
        if isinstance(value, torch.dtype)
    }
    return named | dtypes


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` file, creating nothing but what :func:`_metadata_globals`
    allows."""

    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_globals().get((module, name))
        if found is None:
            raise _RefusedGlobal(f"{module}.{name}")
        return found


class PlainDataReader(dcp.FileSystemReader):
    """torch's file-system checkpoint reader, reading ``.metadata`` with an unpickler that
    refuses anything but the classes torch writes there (:class:`CheckpointError`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        file = Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        with file.open("rb") as stream:
            try:
                metadata = _MetadataUnpickler(stream).load()
            except _RefusedGlobal as refused:
                raise refused_file_error(file, f"it refers to {refused.name}", RESUME_FIX) from None
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise CheckpointError(
                f"checkpoint file {str(file)!r} holds a {type(metadata).__name__}, not a "
                f"checkpoint's metadata; {RESUME_FIX}"
            )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class PlainDataLoadPlanner(DefaultLoadPlanner):
    """torch's load planner, reading the non-tensor entries of ``path``'s ``.distcp`` files
    weights-only (:func:`plugrl.state.checkpoint.load_weights_only`)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        assert self.metadata is not None and self.metadata.storage_data is not None
        relative = self.metadata.storage_data[read_item.storage_index].relative_path
        file = self.path / relative
        try:
            loaded = load_weights_only(value, file=file, fix=RESUME_FIX)
        except CheckpointError:
            raise
        except Exception as exc:
            # torch's reader fails on bytes that are not a torch file in ways that say nothing
            # of the file (a negative seek): name it, and what it should hold
            raise refused_file_error(
                file,
                f"its entry {read_item.dest_index.fqn!r} is not a file torch.save wrote: "
                f"{one_line_cause(exc)}",
                RESUME_FIX,
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, trainable_only: bool = False
) -> dict[str, Any]:
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=options)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


def save(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra_state: dict[str, Any],
    trainable_only: bool = False,
    role: str,
    rank: int,
    world_size: int,
) -> None:
    """Write this rank's part of the checkpoint (collective: every rank of the role calls it).

    ``trainable_only``: leave out frozen weights (a LoRA actor's base model, which setup reads
    from the model folder again)."""
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(_sharded_state(model, optimizer, trainable_only), checkpoint_id=path)
    torch.save(extra_state, extra_state_file(path, rank))
    if rank == 0:
        manifest = {"format": FORMAT_VERSION, "role": role, "world_size": world_size}
        (path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    dist.barrier()


def _check_files(path: Path, rank: int) -> None:
    """Raise a :class:`CheckpointError` naming the first file that is missing or shorter than
    the checkpoint's own index says, before any rank starts reading."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist; {RESUME_FIX}")
    metadata_file = path / ".metadata"
    if not metadata_file.is_file():
        raise CheckpointError(
            f"checkpoint file {str(metadata_file)!r} is missing, so {str(path)!r} is incomplete "
            f"(the run probably stopped while saving); {RESUME_FIX}"
        )
    try:
        metadata = PlainDataReader(path).read_metadata()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint file {str(metadata_file)!r} is corrupt ({type(exc).__name__}); "
            f"{RESUME_FIX}"
        ) from exc
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for relative, size in sorted(needed.items()):
        file = path / relative
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing; {RESUME_FIX}")
        if file.stat().st_size < size:
            raise CheckpointError(
                f"checkpoint file {str(file)!r} is truncated ({file.stat().st_size} of {size} "
                f"bytes); {RESUME_FIX}"
            )
    extra = _extra_state_to_read(path, rank)
    if not extra.is_file():
        writers = _written_by(path)
        written_by = f" (the checkpoint was written by {writers} ranks)" if writers else ""
        raise CheckpointError(
            f"checkpoint file {str(extra)!r} is missing{written_by}; {RESUME_FIX}"
        )


def load(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    rank: int,
    trainable_only: bool = False,
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save` into ``model`` and ``optimizer`` (collective);
    returns this rank's extra state. ``trainable_only`` as :func:`save` was given it: the
    frozen weights stay as they are."""
    problem: CheckpointError | None = None
    extra_state: dict[str, Any] = {}
    try:
        _check_files(path, rank)
        extra_state = _read_extra_state(path, rank)
    except CheckpointError as exc:
        problem = exc
    raise_if_any_rank_failed(problem)
    if optimizer is not None:
        initialize_optimizer_state(optimizer)
    state = _sharded_state(model, optimizer, trainable_only)
    if optimizer is not None and "optimizer" not in _saved_keys(path):
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds no optimizer state (it was saved by a frozen "
            f"reference model); {RESUME_FIX}"
        )
    try:
        dcp.load(
            state,
            checkpoint_id=path,
            storage_reader=PlainDataReader(path),
            planner=PlainDataLoadPlanner(path),
        )
    except (Exception, CheckpointException) as exc:
        refused = _refusal(exc)
        if refused is not None:
            raise CheckpointError(str(refused)) from None
        raise CheckpointError(
            f"checkpoint {str(path)!r} could not be read into this model ({_cause(exc)}); is it "
            f"from a different model? {RESUME_FIX}"
        ) from exc
    set_model_state_dict(
        model,
        state["model"],
        options=StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only),
    )
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return extra_state


def _read_extra_state(path: Path, rank: int) -> dict[str, Any]:
    file = _extra_state_to_read(path, rank)
    try:
        return load_weights_only(file, fix=RESUME_FIX)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint file {str(file)!r} is corrupt ({one_line_cause(exc)}); {RESUME_FIX}"
        ) from exc


def _refusal(exc: BaseException) -> CheckpointError | None:
    """The refusal of a file (:class:`PlainDataLoadPlanner`) that a rank's failure carries."""
    if isinstance(exc, CheckpointError):
        return exc
    if isinstance(exc, CheckpointException):
        for failure in exc.failures.values():
            failed = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(failed, CheckpointError):
                return failed
    return None


def _cause(exc: BaseException) -> str:
    """One line naming what went wrong; torch.distributed.checkpoint wraps each rank's error
    with its traceback."""
    if isinstance(exc, CheckpointException) and exc.failures:
        failure = next(iter(exc.failures.values()))
        exc = failure[0] if isinstance(failure, tuple) else failure
    return one_line_cause(exc)


def _saved_keys(path: Path) -> set[str]:
    metadata = PlainDataReader(path).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}
