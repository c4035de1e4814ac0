"""Videos of dataset rows: decoded once, sampled to frames, checked.

A row's videos are in the column ``data.video_key`` (verl's ``videos``), a list per row; each
``<video>`` in its messages marks one. A video is one of:

- a list of frames, each as an image is given (encoded bytes, a path, ``{"bytes": ...}``):
  every frame is used, at 2 frames a second unless the video says otherwise;
- a video file: its encoded bytes, its path, or ``{"bytes": ..., "path": ...}``, decoded with
  PyAV (``pip install 'plugrl[video]'``) and sampled uniformly, 2 frames a second by default,
  between 4 and 768 frames;
- verl's form, ``{"video": <frames or file>, "fps": ..., "nframes": ..., "min_frames": ...,
  "max_frames": ...}``: ``fps`` is the frame rate to sample a file at (for a list of frames,
  the rate they were taken at), ``nframes`` a fixed number of frames to sample a file to
  (instead of ``fps``), ``min_frames`` and ``max_frames`` bound the count ``fps`` gives.

Resizing is the model's video processor's, as for images.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from plugrl.data.decoding import decode_image, file_source, reason_of, stored_file
from plugrl.errors import DataError

DEFAULT_FPS = 2.0
"""Frames a second sampled from a video file, and the rate of a list of frames, by default."""
DEFAULT_MIN_FRAMES = 4
DEFAULT_MAX_FRAMES = 768
SAMPLING_KEYS = ("fps", "nframes", "min_frames", "max_frames")
"""The sampling settings a video in verl's form may give beside ``video``."""
_IGNORED_KEYS = frozenset({"video", "type"})

VIDEO_FIX = (
    'store a list of frames (image bytes, paths or {"bytes": ...}), a video file\'s bytes or '
    'path, or {"video": ..., "fps": ...}'
)


@attrs.frozen(eq=False)
class DecodedVideo:
    """A video's sampled frames and the rate they stand for."""

    frames: np.ndarray
    """``[T, H, W, 3]`` uint8, in time order."""
    fps: float
    """Frames a second of ``frames`` (the rate a file was sampled at, or a frame list's)."""

    def encoded(self) -> dict[str, Any]:
        """The frames as PNG bytes with their rate: what an engine that runs the model's
        processor itself decodes (:func:`frames_of`); plain values, they pickle through Ray."""
        from PIL import Image

        frames = []
        for frame in self.frames:
            buffer = io.BytesIO()
            Image.fromarray(frame).save(buffer, format="PNG")
            frames.append(buffer.getvalue())
        return {"frames": tuple(frames), "fps": self.fps}


def frames_of(encoded: Mapping[str, Any]) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 frames of a video as :meth:`DecodedVideo.encoded` gives it."""
    from PIL import Image

    return np.stack(
        [np.asarray(Image.open(io.BytesIO(frame)).convert("RGB")) for frame in encoded["frames"]]
    )


def _number(settings: Mapping[str, Any], key: str, where: str, *, integer: bool) -> Any:
    value = settings.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or value <= 0:
        kind = "a whole number" if integer else "a number"
        raise DataError(f"{where}: {key}={value!r}; set it to {kind} above 0, or leave it out")
    return int(value) if integer else float(value)


@attrs.frozen
class Sampling:
    """A video's sampling settings, checked."""

    fps: float | None = None
    nframes: int | None = None
    min_frames: int | None = None
    max_frames: int | None = None

    @classmethod
    def of(cls, settings: Mapping[str, Any], where: str) -> Sampling:
        """The settings of a video in verl's form; one line naming the video and the fix for
        an unknown key, a value that is not a positive number, ``nframes`` with ``fps``, or
        ``min_frames`` above ``max_frames``."""
        unknown = sorted(
            key
            for key, value in settings.items()
            if key not in _IGNORED_KEYS and key not in SAMPLING_KEYS and value is not None
        )
        if unknown:
            raise DataError(
                f"{where} sets {', '.join(unknown)}, which plugrl does not read; a video takes "
                f"{', '.join(SAMPLING_KEYS)} (its frames' size comes from the model's video "
                "processor settings)"
            )
        sampling = cls(
            fps=_number(settings, "fps", where, integer=False),
            nframes=_number(settings, "nframes", where, integer=True),
            min_frames=_number(settings, "min_frames", where, integer=True),
            max_frames=_number(settings, "max_frames", where, integer=True),
        )
        if sampling.nframes is not None and sampling.fps is not None:
            raise DataError(
                f"{where} sets both nframes={sampling.nframes} and fps={sampling.fps:g}; "
                "sample a video to a number of frames or at a frame rate, not both"
            )
        low, high = sampling.min_frames, sampling.max_frames
        if low is not None and high is not None and low > high:
            raise DataError(
                f"{where}: min_frames={low} is above max_frames={high}; set min_frames <= "
                "max_frames"
            )
        return sampling

    def indices(self, total: int, rate: float, where: str) -> np.ndarray:
        """Which of a file's ``total`` frames (at ``rate`` a second) to keep, uniformly
        spread: ``nframes`` of them, else ``fps`` a second within ``min_frames`` and
        ``max_frames`` (and within the file's frames)."""
        if self.nframes is not None:
            if self.nframes > total:
                raise DataError(
                    f"{where}: nframes={self.nframes} but the video has {total} frames; lower "
                    "nframes"
                )
            count = self.nframes
        else:
            fps = self.fps if self.fps is not None else DEFAULT_FPS
            low = self.min_frames if self.min_frames is not None else DEFAULT_MIN_FRAMES
            high = self.max_frames if self.max_frames is not None else DEFAULT_MAX_FRAMES
            wanted = total / rate * fps if rate > 0 else total
            count = max(1, min(math.floor(max(wanted, low)), high, total))
        return np.linspace(0, total - 1, count).round().astype(int)

    def sampled_fps(self, total: int, rate: float, count: int) -> float:
        """The frame rate ``count`` frames spread over a file's ``total`` stand for."""
        return count / total * rate if rate > 0 else (self.fps or DEFAULT_FPS)


def _as_list(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        return value.tolist()
    return value


def decode_video(value: Any, *, where: str, folder: Path | None = None) -> DecodedVideo:
    """One video of a row (see the module's docstring for its forms) as its sampled frames;
    ``where`` names the row, the column and the video in the one-line :class:`DataError` a
    bad value gets."""

    value = _as_list(value)
    settings: Mapping[str, Any] = {}
    if isinstance(value, Mapping) and "video" in value:
        settings, value = value, _as_list(value["video"])
    sampling = Sampling.of(settings, where)
    if isinstance(value, (list, tuple)):
        if not value:
            raise DataError(f"{where} is an empty list of frames; {VIDEO_FIX}")
        fixed = [key for key in ("nframes", "min_frames", "max_frames") if settings.get(key)]
        if fixed:
            raise DataError(
                f"{where} is a list of frames with {', '.join(fixed)} set, which only sample "
                "a video file; a list's frames are all used: drop them, or list fewer frames"
            )
        images = [
            decode_image(frame, where=f"{where}, frame {index}", folder=folder, fix=VIDEO_FIX)
            for index, frame in enumerate(value)
        ]
        sizes = {image.size for image in images}
        if len(sizes) > 1:
            raise DataError(
                f"{where} has frames of {len(sizes)} sizes ({', '.join(map(str, sorted(sizes)))}); "
                "give every frame of a video the same size"
            )
        frames = np.stack([np.asarray(image) for image in images])
        return DecodedVideo(frames, sampling.fps if sampling.fps is not None else DEFAULT_FPS)
    value = stored_file(value, where=where, fix=VIDEO_FIX)
    return _decode_file(value, sampling, where=where, folder=folder)


def _decode_file(
    value: Any, sampling: Sampling, *, where: str, folder: Path | None
) -> DecodedVideo:
    found = file_source(value, where=where, folder=folder)
    if found is None:
        raise DataError(f"{where} is a {type(value).__name__}; {VIDEO_FIX}")
    source, shown = found
    try:
        import av
    except ImportError:
        raise DataError(
            f"{where} is a video file ({shown}), and decoding one needs PyAV; install it "
            "(pip install 'plugrl[video]') or store the video as a list of frames"
        ) from None
    try:
        with av.open(source) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or 0)
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    except Exception as exc:
        raise DataError(
            f"{where} ({shown}) cannot be decoded as a video ({reason_of(exc)}); store an MP4, "
            "WebM, ... file PyAV reads, or the video as a list of frames"
        ) from None
    if not frames:
        raise DataError(f"{where} ({shown}) has no frames; store a video with frames")
    indices = sampling.indices(len(frames), rate, where)
    kept = np.stack([frames[index] for index in indices])
    return DecodedVideo(kept, sampling.sampled_fps(len(frames), rate, len(indices)))
