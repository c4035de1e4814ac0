"""Videos made here for the vision tests: frames drawn with PIL, files encoded with PyAV."""

from __future__ import annotations

import io

from tests.plugins.models.qwen2_vl.images import png_bytes


def frame_list(count: int, size: tuple[int, int] = (56, 56)) -> list[bytes]:
    """``count`` PNG frames of ``size``, a square whose colour changes frame by frame."""
    return [png_bytes((30 * i % 256, 255 - 30 * i % 256, 90), size) for i in range(count)]


def mp4_bytes(count: int, size: tuple[int, int] = (56, 56), fps: int = 4) -> bytes:
    """An MPEG-4 file of ``count`` frames at ``fps`` frames a second."""
    import av
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for frame in frame_list(count, size):
            image = np.asarray(Image.open(io.BytesIO(frame)).convert("RGB"))
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()
