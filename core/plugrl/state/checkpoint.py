"""Run checkpoints: ``<run_dir>/global_step_N/`` plus ``latest_checkpointed_iteration.txt``.

A checkpoint is written into a hidden temporary folder and renamed into place only once it is
complete, with a manifest of every file, its size and its CRC32 written last; the ``latest``
file is replaced atomically after that. A run killed at any moment therefore leaves either the
previous checkpoint or the new one, never a half-written folder that looks complete.
Verification against the manifest catches files removed, cut short or changed afterwards (the
checksums cost one read of the checkpoint per save and per resume; ``checksums=False`` records
and checks sizes only). A save first checks that the device has as much free space as the last
checkpoint took.

Nothing a resume reads may run code: :func:`load_weights_only` reads a torch file as tensors and
plain values only, and refuses, with one line naming the file, one that refers to anything else
(a crafted checkpoint's pickled payload). The trainer state carries a format number
(:data:`TRAINER_STATE_FORMAT`), and the keys the core reads are checked when it is loaded.

Layout of one checkpoint (the backend writes its own files under ``actor/``, ``critic/``...)::

    global_step_N/
      actor/...                 model, optimizer, LR schedule, RNG of every rank
      trainer_state.pt          step, dataloader position, RNG, controllers
      plugrl_checkpoint.json    manifest, written last
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import pickle
import re
import shutil
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from plugrl.errors import CheckpointError

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "plugrl_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.pt"
TRAINER_STATE_FORMAT = 1
"""The format number written into ``trainer_state.pt`` (key ``format``, which the manager
owns: a run's own ``format`` key would be lost); a trainer state written before format
numbers has none."""
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# the key and value types of a trainer state that the core reads when it resumes
_TRAINER_STATE_KEYS: dict[str, tuple[type, str]] = {
    "step": (int, "a number"),
    "dataloader": (dict, "a dict"),
    "weight_version": (int, "a number"),
    "rng": (dict, "a dict"),
}
_OTHER_VERSION_FIX = (
    "resume with the plugrl version that wrote it, or start fresh with "
    "trainer.resume_mode=disable or another trainer.default_local_dir"
)
# a full device in the words of an error that carries no errno (one a worker sent as text)
_NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]|\bENOSPC\b")
# what torch raises when its writer cannot write a file: it loses the OSError (and its ENOSPC)
# of a full device, when writing a path from C++
_TORCH_WRITE_FAILURE = re.compile(
    r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed[^\n]*|basic_ios::clear: iostream error"
)

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


def _out_of_space(exc: BaseException) -> str | None:
    """How ``exc`` says the device is full: ``""`` for an ENOSPC, torch's words for a write
    failure that hides it (see ``_TORCH_WRITE_FAILURE``), ``None`` when it does not."""
    causes = _causes(exc)
    if any(
        getattr(error, "errno", None) == errno.ENOSPC or _NO_SPACE.search(str(error))
        for error in causes
    ):
        return ""
    for error in causes:
        match = _TORCH_WRITE_FAILURE.search(str(error))
        if match:
            return match.group(0)
    return None


def _size(count: int) -> str:
    """A byte count for people: ``512 B``, ``3.2 MiB``, ``1.5 GiB``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM during a save, which torch's distributed checkpoint re-wraps."""
    return any(isinstance(error, KeyboardInterrupt) for error in _causes(exc))


def refused_file_error(file: str | Path, reason: str, fix: str) -> CheckpointError:
    """The one-line error for checkpoint ``file`` refused unread because it holds something
    other than a checkpoint's data (``reason`` says what, e.g. the code it refers to)."""
    return CheckpointError(
        f"checkpoint file {str(file)!r} holds something other than a checkpoint's data "
        f"({reason}), so the run did not load it; {fix}"
    )


def raise_if_any_rank_failed(problem: CheckpointError | None) -> None:
    """Raise on every rank of the process group when any rank found a problem reading its
    checkpoint files (``problem`` is this rank's, or ``None``): a healthy rank would otherwise
    wait in the backend's collective reads for ranks that gave up. A rank raises its own
    error, the others the first failing rank's, so whichever reaches the driver first names
    the file and the fix. A collective: every rank calls it."""
    import torch.distributed as dist

    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, str(problem) if problem else None)
    if problem is not None:
        raise problem
    found = next((message for message in problems if message), None)
    if found is not None:
        raise CheckpointError(found)


def load_weights_only(
    source: str | Path | IO[bytes],
    *,
    fix: str,
    file: str | Path | None = None,
    allowed: Sequence[Any] = (),
    mmap: bool = False,
) -> Any:
    """Read a file ``torch.save`` wrote, on the CPU, as tensors and plain values (numbers,
    strings, lists, tuples, dicts) plus the ``allowed`` classes, so that reading it cannot run
    code: ``torch.load(..., weights_only=True)``.

    A file that refers to anything else (a pickled object whose loading would call it) raises
    :func:`refused_file_error` naming ``file`` (``source`` by default) and ending with
    ``fix``; other failures (a missing or cut file) propagate as torch raises them.
    ``mmap=True`` maps a file's tensors instead of reading them.
    """
    import torch

    try:
        with torch.serialization.safe_globals(list(allowed)):
            if mmap:
                return torch.load(source, map_location="cpu", weights_only=True, mmap=True)
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = _refused_global(exc)
        if refused is None:
            raise  # not a torch file (or a damaged one): callers call it corrupt
        name = file if file is not None else source
        raise refused_file_error(
            name if isinstance(name, (str, Path)) else "<stream>", f"it refers to {refused}", fix
        ) from None


_TORCH_REFUSAL = "Weights only load failed"
_UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", re.DOTALL)


def one_line_cause(exc: BaseException) -> str:
    """``Type: reason`` of a failure to read a checkpoint file, in one line, without the
    advice torch's weights-only refusal gives (to load with ``weights_only=False``, which
    would run whatever code the file refers to)."""
    text = str(exc).strip()
    if text.startswith(_TORCH_REFUSAL):
        detail = _UNPICKLER_ERROR.search(text)
        reason = " ".join(detail.group(1).split()) if detail else "torch refused it"
        return f"{type(exc).__name__}: {reason}"
    lines = text.splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _refused_global(exc: pickle.UnpicklingError) -> str | None:
    """The ``module.name`` a weights-only load refused; ``None`` for other unpickling errors
    (a file that is not a torch file at all, for the caller to call corrupt)."""
    refused = re.search(r"GLOBAL ([\w.]+\w)", str(exc))
    return refused.group(1) if refused else None


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
        trainer state (with :data:`TRAINER_STATE_FORMAT`) and the manifest; the folder
        appears under its final name only when complete. Returns the final path.

        Refused before writing anything when the device has less free space than the last
        checkpoint took; a save that fills the device anyway removes its half-written folder
        and keeps the previous checkpoint."""
        import torch

        self.root.mkdir(parents=True, exist_ok=True)
        self._check_free_space(step)
        final = self.root / step_dir_name(step)
        tmp = self.root / f".{step_dir_name(step)}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        # BaseException: torch's distributed checkpoint raises a CheckpointException that is
        # not an Exception, and an interrupted save must not leave half a folder either
        try:
            write(tmp)
            state = {"step": step, **trainer_state, "format": TRAINER_STATE_FORMAT}
            buffer = io.BytesIO()
            torch.save(state, buffer)
            _check_plain_trainer_state(buffer.getvalue(), step)
            (tmp / TRAINER_STATE_FILE).write_bytes(buffer.getvalue())
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
            full = _out_of_space(exc)
            if full is not None:
                kept = self.steps()
                previous = f"the checkpoint of step {kept[-1]} is kept" if kept else "none is kept"
                what = (
                    f"writing checkpoint {step} under {self.root} failed as it does on a full "
                    f"device (torch: {full})"
                    if full
                    else f"no space left on the device while writing checkpoint {step} under "
                    f"{self.root}"
                )
                raise CheckpointError(
                    f"{what}; {previous} and the half-written one removed; free space, or "
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

    def _check_free_space(self, step: int) -> None:
        """Refuse to start checkpoint ``step`` when the device has less free space than the
        last checkpoint took: the save would fail midway, after a long write."""
        kept = self.steps()
        if not kept:
            return
        last = self.root / step_dir_name(kept[-1])
        needed = sum(file.stat().st_size for file in last.rglob("*") if file.is_file())
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:  # no figure to compare with: let the write find out
            return
        if free < needed:
            told = (_size(free), _size(needed))
            if told[0] == told[1]:  # rounded to the same: the bytes tell them apart
                told = (f"{free} B", f"{needed} B")
            raise CheckpointError(
                f"only {told[0]} free under {self.root}, and the last checkpoint (step "
                f"{kept[-1]}) took {told[1]}: checkpoint {step} was not written, that of "
                f"step {kept[-1]} is kept; free space, or keep fewer checkpoints with "
                "trainer.max_ckpt_to_keep"
            )

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
        self.remove_killed_saves()
        if not self.max_to_keep:
            return
        for step in self.steps()[: -self.max_to_keep]:
            shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)

    def remove_killed_saves(self) -> list[str]:
        """Delete the half-written folders of saves that a kill interrupted (a save that fails
        or is interrupted in-process removes its own); returns their names."""
        removed = []
        if not self.root.is_dir():
            return removed
        for leftover in sorted(self.root.glob(".global_step_*.tmp")):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(leftover.name)
        return removed

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
        removed = self.remove_killed_saves()
        if removed:
            logger.info(
                "removed %s under %s: half-written by a save that was killed",
                ", ".join(removed),
                self.root,
            )
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
        """The trainer state saved with a checkpoint (step, dataloader, RNG, controllers), as
        the run saved it (without the format number).

        Read as plain data only (:func:`load_weights_only`); a state of another format, or
        without the keys the core reads, raises a :class:`CheckpointError` saying which."""
        file = path / TRAINER_STATE_FILE
        fix = (
            "delete that folder to resume from an earlier checkpoint, or set "
            "trainer.resume_mode=disable"
        )
        try:
            state = load_weights_only(file, fix=fix)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint {path}: cannot read {TRAINER_STATE_FILE} as plain data "
                f"({one_line_cause(exc)}); {fix}"
            ) from None
        problem = _trainer_state_problem(state)
        if problem is not None:
            raise CheckpointError(
                f"checkpoint {path}: {TRAINER_STATE_FILE} {problem}, so another plugrl version "
                f"wrote it (this one reads trainer state format {TRAINER_STATE_FORMAT}); "
                f"{_OTHER_VERSION_FIX}"
            )
        state.pop("format", None)
        return state


def _check_plain_trainer_state(data: bytes, step: int) -> None:
    """Refuse to save a trainer state that its resume would refuse: one holding objects
    other than tensors and plain values."""
    import torch

    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = _refused_global(exc) or "something a weights-only load cannot read"
        raise CheckpointError(
            f"the trainer state of checkpoint {step} holds {refused}, which a resume would "
            "refuse to load: keep it to tensors, numbers, strings, lists, tuples and dicts (a "
            "scheduler's saved state included)"
        ) from None


def _trainer_state_problem(state: Any) -> str | None:
    """What keeps the core from resuming with ``state``, or ``None``."""
    from plugrl.state import rng

    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a dict"
    # without a format number: written before there were any, and read as format 1
    if "format" in state:
        version = state["format"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            return f"has format {version!r}, not a format number"
        if version > TRAINER_STATE_FORMAT:
            return f"is in format {version}"
    for key, (kind, described) in _TRAINER_STATE_KEYS.items():
        if key not in state:
            return f"has no {key!r}"
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"holds {key!r} as a {type(value).__name__}, not {described}"
    rng_problem = rng.state_problem(state["rng"])
    if rng_problem is not None:
        return f"holds an 'rng' that {rng_problem}"
    return None
