"""Run checkpoints: ``<run_dir>/global_step_N/`` plus ``latest_checkpointed_iteration.txt``.

A checkpoint is written into a hidden temporary folder and renamed into place only once it is
complete, with a manifest of every file, its size and its CRC32 written last; the ``latest``
file is replaced atomically after that. A run killed at any moment therefore leaves either the
previous checkpoint or the new one, never a half-written folder that looks complete.
Verification against the manifest catches files removed, cut short or changed afterwards (the
checksums cost one read of the checkpoint per save and per resume; ``checksums=False`` records
and checks sizes only).

Layout of one checkpoint (the backend writes its own files under ``actor/``, ``critic/``...)::

    global_step_N/
      actor/...                 model, optimizer, LR schedule, RNG of every rank
      trainer_state.pt          step, dataloader position, RNG, controllers
      plugrl_checkpoint.json    manifest, written last
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugrl.errors import CheckpointError

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "plugrl_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")

logger = logging.getLogger("plugrl.checkpoint")


def step_dir_name(step: int) -> str:
    return f"global_step_{step}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def file_crc32(path: Path, chunk_size: int = 1 << 23) -> str:
    """The CRC32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with path.open("rb") as file:
        while chunk := file.read(chunk_size):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what caused it, and the ranks' failures it carries (torch's distributed
    checkpoint collects each rank's exception in ``failures``, with its stack as
    ``(exception, stack)``), recursively."""
    seen: dict[int, BaseException] = {}
    pending: list[BaseException] = [exc]
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen[id(error)] = error
        pending += [e for e in (error.__cause__, error.__context__) if e is not None]
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            for failure in failures.values():
                failed = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(failed, BaseException):
                    pending.append(failed)
    return list(seen.values())


def _out_of_space(exc: BaseException) -> bool:
    return any(
        getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)
        for error in _causes(exc)
    )


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM during a save, which torch's distributed checkpoint re-wraps."""
    return any(isinstance(error, KeyboardInterrupt) for error in _causes(exc))


class CheckpointManager:
    """Saves, finds, verifies and prunes the checkpoints of one run folder."""

    def __init__(
        self, root: str | Path, max_to_keep: int | None = None, *, checksums: bool = True
    ) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.checksums = checksums

    # ---------------------------------------------------------------------------- saving

    def save(self, step: int, write: Callable[[Path], None], trainer_state: dict[str, Any]) -> Path:
        """Write checkpoint ``step``: ``write(folder)`` stores the parts' files, then the
        trainer state and the manifest; the folder appears under its final name only when
        complete. Returns the final path."""
        import torch

        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / step_dir_name(step)
        tmp = self.root / f".{step_dir_name(step)}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        # BaseException: torch's distributed checkpoint raises a CheckpointException that is
        # not an Exception, and an interrupted save must not leave half a folder either
        try:
            write(tmp)
            torch.save({"step": step, **trainer_state}, tmp / TRAINER_STATE_FILE)
            files: dict[str, dict[str, Any]] = {}
            for path in sorted(tmp.rglob("*")):
                if path.is_file():
                    entry: dict[str, Any] = {"size": path.stat().st_size}
                    if self.checksums:
                        entry["crc32"] = file_crc32(path)
                    files[str(path.relative_to(tmp))] = entry
            manifest = json.dumps({"step": step, "files": files}, indent=1)
            _write_atomic(tmp / MANIFEST_FILE, manifest)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if _out_of_space(exc):
                kept = self.steps()
                previous = f"the checkpoint of step {kept[-1]} is kept" if kept else "none is kept"
                raise CheckpointError(
                    f"no space left on the device while writing checkpoint {step} under "
                    f"{self.root}; {previous} and the half-written one removed; free space, or "
                    "keep fewer checkpoints with trainer.max_ckpt_to_keep"
                ) from None
            if _interrupted(exc) and not isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt from None  # stopped by the user, not failed
            raise
        if final.exists():  # the same step saved again after a resume
            old = self.root / f".{step_dir_name(step)}.old"
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        _write_atomic(self.root / LATEST_FILE, f"{step}\n")
        self.prune()
        return final

    def steps(self) -> list[int]:
        """Steps of the complete-looking checkpoint folders, ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and path.is_dir() and (path / MANIFEST_FILE).exists():
                found.append(int(match.group(1)))
        return sorted(found)

    def prune(self) -> None:
        """Delete the oldest checkpoints beyond ``max_to_keep`` and leftovers of killed saves."""
        for leftover in self.root.glob(".global_step_*.tmp"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        if not self.max_to_keep:
            return
        for step in self.steps()[: -self.max_to_keep]:
            shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)

    # ---------------------------------------------------------------------------- resuming

    def latest(self) -> Path | None:
        """The checkpoint ``latest_checkpointed_iteration.txt`` names (verified), or ``None``.

        When that folder was deleted, the newest checkpoint before it."""
        latest_file = self.root / LATEST_FILE
        if not latest_file.exists():
            return None
        text = latest_file.read_text(encoding="utf-8").strip()
        if not text.isdigit():
            raise CheckpointError(
                f"{latest_file} should hold a step number, holds {text[:40]!r}; delete it to "
                "start fresh, or set trainer.resume_mode to a global_step_N folder"
            )
        step = int(text)
        path = self.root / step_dir_name(step)
        if not path.exists():
            # what the user is told to do with a corrupt checkpoint: delete it, resume from the
            # one before
            earlier = [found for found in self.steps() if found < step]
            if not earlier:
                raise CheckpointError(
                    f"{latest_file} names step {step} but {path.name} does not exist and no "
                    f"earlier checkpoint is in {self.root}; set trainer.resume_mode=disable to "
                    "start fresh"
                )
            path = self.root / step_dir_name(earlier[-1])
            logger.warning(
                "%s does not exist; resuming from %s, the newest checkpoint before it",
                step_dir_name(step),
                path.name,
            )
        self.verify(path)
        return path

    def resolve(self, resume_mode: str) -> Path | None:
        """The checkpoint to resume from for ``trainer.resume_mode`` (``auto``, ``disable`` or a
        path), verified; ``None`` to start fresh."""
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            return self.latest()
        path = Path(resume_mode)
        if not path.is_dir():
            raise CheckpointError(
                f"trainer.resume_mode: checkpoint folder {str(path)!r} does not exist; give a "
                "global_step_N folder, 'auto' or 'disable'"
            )
        self.verify(path)
        return path

    def verify(self, path: Path) -> dict[str, Any]:
        """Check a checkpoint folder against its manifest; returns the manifest."""
        manifest_path = path / MANIFEST_FILE
        fix = (
            "delete that folder to resume from an earlier checkpoint, or set "
            "trainer.resume_mode=disable to start fresh"
        )
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} does not exist; {fix}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            files = manifest["files"]
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {path} is incomplete (no {MANIFEST_FILE}); {fix}"
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(
                f"checkpoint {path} has a corrupt {MANIFEST_FILE}; {fix}"
            ) from None
        for name, entry in files.items():
            # manifests of earlier versions held the size alone
            size, crc = (
                (entry, None) if isinstance(entry, int) else (entry["size"], entry.get("crc32"))
            )
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing; {fix}")
            actual = file.stat().st_size
            if actual != size:
                raise CheckpointError(
                    f"checkpoint {path} is corrupt: {name} has {actual} bytes, the manifest "
                    f"says {size}; {fix}"
                )
            if self.checksums and crc is not None and file_crc32(file) != crc:
                raise CheckpointError(
                    f"checkpoint {path} is corrupt: {name} has changed since it was saved (its "
                    f"CRC32 differs from the manifest's); {fix}"
                )
        return manifest

    def load_trainer_state(self, path: Path) -> dict[str, Any]:
        """The trainer state saved with a checkpoint (step, dataloader, RNG, controllers)."""
        import torch

        try:
            # plain data only (tensors, numbers, strings, lists, dicts): unpickling anything
            # else could run code from a crafted checkpoint
            return torch.load(path / TRAINER_STATE_FILE, weights_only=True)
        except Exception as exc:
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise CheckpointError(
                f"checkpoint {path}: cannot read {TRAINER_STATE_FILE} as plain data "
                f"({type(exc).__name__}: {reason}); delete that folder to resume from an "
                "earlier checkpoint, or set trainer.resume_mode=disable"
            ) from None
