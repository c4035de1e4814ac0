"""Images drawn here for the vision tests: nothing is downloaded."""

from __future__ import annotations

import io


def png_bytes(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> bytes:
    """A PNG of ``size`` (width, height): a square of ``color`` on a grey field, so that its
    patches differ."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, (128, 128, 128))
    ImageDraw.Draw(image).rectangle((4, 4, size[0] // 2, size[1] // 2), fill=color)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
