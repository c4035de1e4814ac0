"""Crafted checkpoints: files whose unpickling would run a command, planted where a resume
reads, to show that a resume refuses them without running it."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from plugrl.state.checkpoint import MANIFEST_FILE, file_crc32

SYSTEM = f"{os.system.__module__}.system"
"""How a pickle names ``os.system`` (``posix.system`` on Linux)."""


class RunsACommand:
    """Unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def torch_payload(marker: Path, around: Any = None) -> bytes:
    """A torch file holding the payload (inside ``around``'s dict when given)."""
    buffer = io.BytesIO()
    payload = RunsACommand(marker)
    torch.save({**around, "payload": payload} if around is not None else payload, buffer)
    return buffer.getvalue()


def plant_in_torch_file(file: Path, marker: Path) -> None:
    """Replace a ``torch.save`` file of a dict by the same dict plus the payload."""
    file.write_bytes(torch_payload(marker, torch.load(file, weights_only=True)))


def plant_in_dcp_metadata(folder: Path, marker: Path) -> Path:
    """Put the payload into the ``.metadata`` of torch's distributed checkpoint in
    ``folder``; returns the file."""
    file = folder / ".metadata"
    metadata = pickle.loads(file.read_bytes())  # the test's own checkpoint: trusted
    metadata.planner_data["payload"] = RunsACommand(marker)
    file.write_bytes(pickle.dumps(metadata))
    return file


def plant_in_dcp_bytes(folder: Path, marker: Path) -> Path:
    """Point one non-tensor entry of the distributed checkpoint in ``folder`` (an optimizer
    hyper-parameter) at the payload, appended to the data file that holds it; returns that
    file."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata_file = folder / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    fqn = next(
        key
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, BytesStorageMetadata)
    )
    index = next(index for index in metadata.storage_data if index.fqn == fqn)
    info = metadata.storage_data[index]
    data_file = folder / info.relative_path
    payload = torch_payload(marker)
    offset = data_file.stat().st_size
    with data_file.open("ab") as stream:
        stream.write(payload)
    info.offset, info.length = offset, len(payload)
    metadata_file.write_bytes(pickle.dumps(metadata))
    return data_file


def rewrite_manifest(step_folder: Path) -> None:
    """Give a checkpoint folder's manifest the sizes and checksums of its files as they are
    now, as whoever crafted it would."""
    manifest_file = step_folder / MANIFEST_FILE
    manifest = json.loads(manifest_file.read_text())
    manifest["files"] = {
        str(path.relative_to(step_folder)): {"size": path.stat().st_size, "crc32": file_crc32(path)}
        for path in sorted(step_folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }
    manifest_file.write_text(json.dumps(manifest))


def runs_when_unpickled(file: Path, marker: Path) -> bool:
    """Whether loading ``file`` the unsafe way runs its payload (proof that a test planted a
    live one); the marker is removed again."""
    torch.load(file, weights_only=False)  # on purpose: the file is the test's own payload
    ran = marker.exists()
    marker.unlink(missing_ok=True)
    return ran
