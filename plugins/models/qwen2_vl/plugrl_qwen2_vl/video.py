"""Qwen2-VL's video processing with PIL and numpy, for frames already sampled.

transformers' ``Qwen2VLVideoProcessor`` resizes frames with torchvision, which does not load
against a CPU build of torch; this one gives the same outputs (``pixel_values_videos``,
``video_grid_thw``) from the folder's video settings: each frame resized to a multiple of
``patch_size * merge_size`` within the video's pixel bounds, rescaled and normalised by the PIL
image processor's own functions, the frame count padded to a multiple of
``temporal_patch_size`` by repeating the last frame, and the patches laid out as the model's
vision tower reads them (each merged patch's ``merge x merge`` patches one after the other, each
patch's frames side by side).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

VIDEO_CONFIG = "video_preprocessor_config.json"
"""The video processor's settings in a model folder; older Qwen2-VL folders keep them in the
image processor's ``preprocessor_config.json``, read then."""

_SETTINGS = (
    "size",
    "min_pixels",
    "max_pixels",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "rescale_factor",
    "do_resize",
    "do_rescale",
    "do_normalize",
    "resample",
)


class PilVideoProcessor:
    """The part of a Qwen2-VL processor that turns videos (each a ``[T, H, W, 3]`` uint8
    array of sampled frames) into the model's video inputs. ``frames`` is the PIL image
    processor that resizes, rescales and normalises one frame with the video's settings."""

    model_input_names = ("pixel_values_videos", "video_grid_thw")

    def __init__(self, frames: Any) -> None:
        self.frames = frames
        self.patch_size = int(frames.patch_size)
        self.temporal_patch_size = int(frames.temporal_patch_size)
        self.merge_size = int(frames.merge_size)

    @classmethod
    def from_folder(cls, model_path: str | Path) -> PilVideoProcessor:
        """The video processor of a model folder: its ``video_preprocessor_config.json``, else
        its ``preprocessor_config.json``."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        folder = Path(model_path)
        path = folder / VIDEO_CONFIG
        if not path.is_file():
            path = folder / "preprocessor_config.json"
        settings = json.loads(path.read_text()) if path.is_file() else {}
        chosen = {key: settings[key] for key in _SETTINGS if settings.get(key) is not None}
        return cls(Qwen2VLImageProcessorPil(**chosen))

    def to_dict(self) -> dict[str, Any]:
        """The settings, as transformers' processors list their parts'."""
        return {**self.frames.to_dict(), "video_processor_type": type(self).__name__}

    def _frames(self, video: np.ndarray) -> np.ndarray:
        """``[T, C, h, w]`` float32: each frame resized, rescaled and normalised."""
        frames = self.frames
        size, factor = frames.size, self.patch_size * self.merge_size
        out = []
        for frame in video:
            image = np.ascontiguousarray(np.asarray(frame).transpose(2, 0, 1))
            if frames.do_resize:
                image = frames.resize(image, size=size, resample=frames.resample, factor=factor)
            if frames.do_rescale:
                image = frames.rescale(image, frames.rescale_factor)
            if frames.do_normalize:
                image = frames.normalize(image, frames.image_mean, frames.image_std)
            out.append(np.asarray(image, dtype=np.float32))
        return np.stack(out)

    def patches(self, video: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """One video's flattened patches ``[t*h*w, C*tp*p*p]`` and its grid ``[t, h, w]``."""
        frames = self._frames(video)
        tp, p, merge = self.temporal_patch_size, self.patch_size, self.merge_size
        if pad := -len(frames) % tp:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        count, channels, height, width = frames.shape
        grid_t, grid_h, grid_w = count // tp, height // p, width // p
        patches = frames.reshape(
            grid_t, tp, channels, grid_h // merge, merge, p, grid_w // merge, merge, p
        )
        # (t, h/m, w/m, m_h, m_w, C, tp, p_h, p_w): the merged patches in order, each patch's
        # channels, frames and pixels together, as the vision tower's patch embedding reads them
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = patches.reshape(grid_t * grid_h * grid_w, channels * tp * p * p)
        return flat, [grid_t, grid_h, grid_w]

    def __call__(
        self,
        videos: Sequence[np.ndarray],
        *,
        video_metadata: Sequence[Any] | None = None,
        return_metadata: bool = False,
        return_tensors: str | None = None,
        **_: Any,
    ) -> Any:
        """``pixel_values_videos`` (every video's patches one after the other) and
        ``video_grid_thw`` (one row per video); with ``return_metadata`` the videos'
        ``video_metadata`` as given (Qwen2.5-VL's processor reads their frame rates)."""
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.video_utils import make_batched_videos

        batched = make_batched_videos(videos)
        flats, grids = zip(*(self.patches(np.asarray(video)) for video in batched), strict=True)
        data: dict[str, Any] = {
            "pixel_values_videos": np.concatenate(flats),
            "video_grid_thw": np.asarray(grids, dtype=np.int64),
        }
        features = BatchFeature(data=data, tensor_type=return_tensors)
        if return_metadata:
            features["video_metadata"] = list(video_metadata or [])
        return features
