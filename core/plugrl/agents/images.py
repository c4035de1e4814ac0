"""Images in agent loops: a vision-language model's prompt images, and the images a tool result
or an environment's observation carries, turned into their tokens and image inputs.

A loop renders messages as text with the model family's image text (``<|vision_start|>
<|image_pad|><|vision_end|>`` for Qwen2-VL) where each image goes (:meth:`TurnImages.place`),
then encodes that text with the images (:meth:`TurnImages.encode`): the processor expands each
image to its tokens and computes its image inputs, which the loop keeps in
``Trajectory.image_inputs`` in the order the tokens come and passes to every later
``Session.generate``. The trainer's batch row then holds all of them in that order, and its
positions are the model's own over the whole sequence (M-RoPE), as for a prompt with images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from plugrl.data.batch import MULTIMODAL_COLUMN
from plugrl.data.multimodal import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, decode_image
from plugrl.errors import DataError

if TYPE_CHECKING:
    from plugrl.data.multimodal import MultimodalData
    from plugrl.parts.agent import Message

IMAGE_FIX = 'return PIL images, PNG or JPEG bytes, {"bytes": ...} or a path to an image file'
"""How a tool or an environment fixes an image that cannot be decoded."""


class TurnImages:
    """A vision-language model's images in the agent loops of a run (``Session.images``):
    its family's image text, its processor, and the tokens that stand for images."""

    def __init__(self, multimodal: MultimodalData, tokenizer: Any) -> None:
        self.multimodal = multimodal
        self.tokenizer = tokenizer

    @property
    def image_text(self) -> str:
        """The text one image is rendered as, before the processor expands it."""
        return self.multimodal.family.image_text()

    def count_placeholders(self, content: str) -> int:
        """The ``<image>`` placeholders in ``content``."""
        return content.count(IMAGE_PLACEHOLDER)

    def place(self, content: str, count: int, *, what: str) -> str:
        """``content`` with ``count`` images in it: each ``<image>`` becomes the image text
        when there are as many as images; without any, the images come before the text;
        otherwise a one-line :class:`DataError` naming ``what``."""
        marked = self.count_placeholders(content)
        if marked == count:
            return content.replace(IMAGE_PLACEHOLDER, self.image_text)
        if marked == 0:
            return self.image_text * count + content
        raise DataError(
            f"{what} marks {marked} {IMAGE_PLACEHOLDER} places for {count} images; put one "
            f"{IMAGE_PLACEHOLDER} where each image goes, or none to put them before the text"
        )

    def place_in_messages(
        self, messages: Sequence[Message], count: int, *, what: str
    ) -> list[Message]:
        """``messages`` with ``count`` images placed: each ``<image>`` of their text contents
        becomes the image text when there are as many as images; without any, the images come
        before the first text content; otherwise a one-line :class:`DataError`."""
        texts = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str)]
        marked = sum(self.count_placeholders(messages[i]["content"]) for i in texts)
        out = [dict(m) for m in messages]
        if count == 0 and marked == 0:
            return out
        if marked == count:
            for i in texts:
                out[i]["content"] = out[i]["content"].replace(IMAGE_PLACEHOLDER, self.image_text)
            return out
        if marked == 0 and texts:
            first = texts[0]
            out[first]["content"] = self.image_text * count + out[first]["content"]
            return out
        raise DataError(
            f"{what} marks {marked} {IMAGE_PLACEHOLDER} places for {count} images; put one "
            f"{IMAGE_PLACEHOLDER} where each image goes, or none to put them before the text"
        )

    def prompt_messages(self, messages: Sequence[Message], row: Mapping[str, Any]) -> list[Message]:
        """A row's prompt ``messages`` with each ``<image>`` as the image text and each
        ``<video>`` as the video text, when the row has images or videos (the dataset checked
        there is one per image and per video); unchanged otherwise."""
        out = [dict(m) for m in messages]
        inputs = row.get(MULTIMODAL_COLUMN)
        if inputs is None:
            return out
        family = self.multimodal.family
        has_videos = any(key in inputs for key in family.video_input_keys)
        for message in out:
            if isinstance(message.get("content"), str):
                content = message["content"].replace(IMAGE_PLACEHOLDER, self.image_text)
                if has_videos:
                    content = content.replace(VIDEO_PLACEHOLDER, family.video_text())
                message["content"] = content
        return out

    def decode(self, images: Sequence[Any], *, what: str) -> list[Any]:
        """Each image as an RGB ``PIL.Image``; one that cannot be decoded is a one-line
        :class:`DataError` naming ``what`` and the image's index."""
        return [
            decode_image(value, where=f"{what}: image {index}", fix=IMAGE_FIX)
            for index, value in enumerate(images)
        ]

    def encode(
        self, text: str, images: Sequence[Any], *, what: str
    ) -> tuple[list[int], dict[str, Any] | None]:
        """The token ids of rendered ``text`` holding one image text per image of ``images``
        (decoded first), each expanded to the image's tokens by the processor, and the images'
        inputs (``None`` without images)."""
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), None
        decoded = self.decode(images, what=what)
        processed = self.multimodal.processor(
            text=[text], images=decoded, return_tensors="pt", add_special_tokens=False
        )
        ids = processed["input_ids"][0].tolist()
        keys = self.multimodal.family.input_keys
        return ids, {key: processed[key] for key in keys if key in processed}

    def prompt(self, text: str, row: Mapping[str, Any]) -> tuple[list[int], dict[str, Any] | None]:
        """The token ids of a prompt rendered again from ``row``'s messages (each image
        placed with :meth:`place_in_messages`), its images and videos expanded from the row's inputs
        (computed when the dataset was read), and those inputs (``None`` without images)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        inputs = row.get(MULTIMODAL_COLUMN)
        if inputs is None:
            return ids, None
        return self.multimodal.family.expand_image_tokens(ids, inputs), dict(inputs)

    def image_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` stand for images."""
        vision = self.multimodal.vision_token_ids
        return sum(1 for token in token_ids if token in vision)
