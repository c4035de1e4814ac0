"""Images of dataset rows, tool results and requests: decoded to RGB ``PIL.Image``, or read
as the encoded bytes an engine that runs the model's processor itself decodes."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugrl.errors import DataError


def reason_of(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name: the reason a one-line error
    gives."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def file_source(value: Any, *, where: str, folder: Path | None) -> tuple[Any, str] | None:
    """What a decoder opens for a row's encoded bytes or file path, and how its error names
    it: ``(BytesIO, "N bytes")`` or ``(path, path)``, a relative path read as given, else
    relative to ``folder`` (the parquet file's); ``None`` for a value that is neither. A path
    that is not a file is a one-line :class:`DataError` naming ``where``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(value)), f"{len(value)} bytes"
    if not isinstance(value, str):
        return None
    path = Path(value.removeprefix("file://"))
    if not path.is_absolute() and not path.exists() and folder is not None:
        path = folder / path
    if not path.is_file():
        raise DataError(
            f"{where} is the path {value}, which is not a file; fix the path (a relative "
            "one is read from the working folder or the parquet file's folder)"
        )
    return str(path), str(path)


def stored_file(value: Any, *, where: str, fix: str) -> Any:
    """The encoded bytes or the path inside a ``{"bytes": ...}`` / ``{"path": ...}`` value
    (the form of Hugging Face datasets' image and video columns), bytes first; any other value
    as given. A mapping with neither is a one-line :class:`DataError` naming ``where``, ending
    with ``fix``."""
    if not isinstance(value, Mapping):
        return value
    if value.get("bytes") is not None:
        return value["bytes"]
    if value.get("path"):
        return value["path"]
    raise DataError(f"{where} has neither bytes nor a path; {fix}")


def decode_image(
    value: Any, *, where: str, folder: Path | None = None, fix: str | None = None
) -> Any:
    """One image of a row as an RGB ``PIL.Image``: ``value`` is encoded bytes, a path (read
    as given, else relative to ``folder``, the parquet file's), ``{"bytes": ...}`` or
    ``{"path": ...}``, or a ``PIL.Image``. ``where`` names the row, the column and the image
    in the one-line :class:`DataError` a value that is not an image gets; ``fix`` replaces
    the fix it gives for a value that is not an image (a tool's images are returned, not
    stored)."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    value = stored_file(
        value,
        where=where,
        fix='store the image\'s encoded bytes as {"bytes": ...} or its file as {"path": ...}',
    )
    found = file_source(value, where=where, folder=folder)
    if found is not None:
        source, shown = found
    else:
        raise DataError(
            f"{where} is a {type(value).__name__}; "
            + (fix or 'store encoded image bytes, a path to an image file, or {"bytes": ...}')
        )
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except Exception as exc:
        raise DataError(
            f"{where} ({shown}) cannot be decoded as an image ({reason_of(exc)}); "
            + (fix or "store PNG or JPEG bytes, or a path to such a file")
        ) from None


def encoded_image(value: Any, decoded: Any, *, folder: Path | None = None) -> bytes:
    """The encoded bytes of one image of a row that :func:`decode_image` decoded to
    ``decoded``: the row's own bytes, the file's bytes for a path (read once, when the
    dataset is built, so no engine needs the file), or ``decoded`` as PNG for an image given
    decoded. Compact, and they pickle as they are, through Ray too."""
    if isinstance(value, Mapping):
        value = value["bytes"] if value.get("bytes") is not None else value["path"]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        path = Path(value.removeprefix("file://"))
        if not path.is_absolute() and not path.exists() and folder is not None:
            path = folder / path
        return path.read_bytes()
    buffer = io.BytesIO()
    decoded.save(buffer, format="PNG")
    return buffer.getvalue()
