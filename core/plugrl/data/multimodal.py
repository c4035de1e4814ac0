"""Images in a run: rows in verl's layout, processed once, carried with the batch.

A row's chat messages mark each image's place with ``<image>``; the images are in the column
``data.image_key`` (verl's ``images``), a list per row whose items are encoded image bytes, a
path to an image file, or ``{"bytes": ..., "path": ...}`` (the struct parquet writers store).
When the dataset is built each image is decoded once, the model's processor turns the row's
rendered text and its images into the prompt's token ids (each image expanded to its tokens)
and the model's image inputs once, and those inputs travel with the row in the batch column
:data:`MULTIMODAL_COLUMN` (a mapping of tensors per row, ``None`` for a row without images):
they pickle with the batch, through Ray too. A trainer or engine joins a micro-batch's rows
with :func:`model_inputs` and passes them to the model's ``forward``. After generation,
:func:`add_model_positions` replaces the batch's positions by the model's own.

What depends on the model family (its processor, the text an ``<image>`` becomes, its
positions) comes from the plugin that answers the ``multimodal_model`` hook for the model's
type (:class:`MultimodalModel`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.data.batch import MULTIMODAL_COLUMN
from plugrl.data.decoding import decode_image, encoded_image
from plugrl.errors import DataError

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import ModelConfig


IMAGE_PLACEHOLDER = "<image>"
"""What marks an image's place in a row's message text (verl's layout)."""
VIDEO_PLACEHOLDER = "<video>"
"""What marks a video's place in a row's message text (verl's layout)."""


class MultimodalModel(ABC):
    """One family of vision-language models, for one model folder: the plugin's
    ``multimodal_model`` hook returns the class, the core builds it as
    ``cls(model_path, hf_config)`` (the folder and its ``AutoConfig``).

    ``input_keys``: the keys of the processor's output that are the model's image inputs; they
    are kept per row in ``multi_modal_inputs`` and a micro-batch's rows are joined along their
    first dimension (the layout Hugging Face vision-language models take: all images' patches
    one after the other, one grid row per image).
    ``vision_token_ids(tokenizer)``: the ids of every token the processor puts in for an image,
    which a prompt may never be truncated through.
    """

    input_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "image_grid_thw")
    video_input_keys: ClassVar[tuple[str, ...]] = ()
    """The keys of the processor's output that are the model's video inputs (empty for a
    family that takes no videos); kept and joined as :attr:`input_keys` are."""

    def __init__(self, model_path: str, hf_config: Any) -> None:
        self.model_path = model_path
        self.hf_config = hf_config

    @abstractmethod
    def processor(self, tokenizer: Any) -> Any:
        """The model's processor, using ``tokenizer`` (the run's):
        called as ``processor(text=[text], images=[...], return_tensors="pt")``, it returns
        ``input_ids`` with each image's placeholder expanded to its tokens, and the
        :attr:`input_keys`."""

    @abstractmethod
    def image_text(self) -> str:
        """The text that replaces one ``<image>`` placeholder before the chat template is
        applied (the processor then expands it to the image's tokens)."""

    def video_text(self) -> str:
        """The text that replaces one ``<video>`` placeholder before the chat template is
        applied (the processor then expands it to the video's tokens); a family that takes no
        videos keeps the default, which refuses them."""
        raise DataError(
            f"the model family {type(self).__name__} takes no videos; train it on images, or "
            "drop the rows' videos"
        )

    @abstractmethod
    def vision_token_ids(self, tokenizer: Any) -> frozenset[int]:
        """Ids of the tokens that stand for images in a processed prompt."""

    def dummy_image(self) -> tuple[list[int], dict[str, Any]]:
        """The token ids and image inputs of the smallest image the model takes, for a
        forward that must run the vision tower without an image of its own (a rank whose
        micro-batch has none, while the others' do)."""
        raise NotImplementedError(
            f"{type(self).__name__} gives no dummy image; a vision-language model on several "
            "ranks needs one"
        )

    def dummy_video(self) -> tuple[list[int], dict[str, Any]]:
        """As :meth:`dummy_image`, the smallest video (for a family with
        :attr:`video_input_keys`): the model runs its vision tower once for a micro-batch's
        videos, so a rank without one runs it on this."""
        raise NotImplementedError(
            f"{type(self).__name__} gives no dummy video; a vision-language model that takes "
            "videos on several ranks needs one"
        )

    def expand_image_tokens(
        self, token_ids: Sequence[int], inputs: Mapping[str, torch.Tensor]
    ) -> list[int]:
        """``token_ids`` of text holding one :meth:`image_text` per image, with each image's
        placeholder expanded to its tokens as the processor expands it, for images whose
        ``inputs`` are already computed (a dataset row's ``multi_modal_inputs``): a prompt
        rendered again, by an agent loop with its tools, keeps its images without decoding
        them again."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot expand the image tokens of a prompt rendered again; "
            "agent loops that render a prompt with images need it"
        )

    vision_tower_names: ClassVar[tuple[str, ...]] = ("model.visual", "visual")
    """Where the model's vision tower may be, as submodule paths (the first that exists)."""

    def vision_tower(self, model: Any) -> Any:
        """The model's vision tower (the image encoder and what projects its output into the
        language model), for training the language model alone."""
        return _first_submodule(
            model, self.vision_tower_names, "vision tower", "vision_tower_names"
        )

    language_model_names: ClassVar[tuple[str, ...]] = ("model.language_model", "language_model")
    """Where the model's language model (the decoder the merged text and image embeddings go
    into) may be, as submodule paths (the first that exists)."""

    def language_model(self, model: Any) -> Any:
        """The model's language model: the module the model calls with ``inputs_embeds``
        (text and image embeddings merged) and ``position_ids``, which sequence parallelism
        slices per rank."""
        return _first_submodule(
            model, self.language_model_names, "language model", "language_model_names"
        )

    @abstractmethod
    def position_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        inputs: Sequence[Mapping[str, torch.Tensor] | None],
    ) -> torch.Tensor:
        """Position ids ``[B, k, L]`` of whole sequences ``input_ids`` ``[B, L]`` (padding
        where ``attention_mask`` is 0) whose rows hold the images of ``inputs`` (a row's
        :attr:`input_keys`, ``None`` for a row without images), as the model computes them
        itself."""


def _as_tensor(value: Any) -> Any:
    """A processor output as a tensor (Qwen2.5-VL's ``second_per_grid_ts`` may stay a list)."""
    import torch

    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _image_list(value: Any, origin: str, image_key: str) -> list[Any]:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise DataError(
        f"{origin}: column {image_key!r} holds a {type(value).__name__}; it must hold a list "
        "per row (an empty list or null for a row without any)"
    )


@attrs.frozen
class EncodedRow:
    """A row's prompt token ids with its images and videos expanded, and its model inputs."""

    prompt_ids: list[int]
    inputs: dict[str, Any] | None
    """The processor's :attr:`MultimodalModel.input_keys` for the row's images and its
    :attr:`MultimodalModel.video_input_keys` for its videos (each tensor's first dimension
    indexes patches, images or videos), ``None`` without either."""
    num_images: int
    images: tuple[bytes, ...] = ()
    """The row's images as encoded bytes (PNG, JPEG, ...), in placeholder order: what an
    engine that runs the model's processor itself decodes (:func:`encoded_image`)."""
    num_videos: int = 0
    videos: tuple[dict[str, Any], ...] = ()
    """The row's videos as sampled frames (PNG bytes) and their rate, in placeholder order
    (:meth:`plugrl.data.video.DecodedVideo.encoded`), for the same engines."""


def _count(messages: Sequence[Mapping[str, str]], placeholder: str) -> int:
    return sum(message["content"].count(placeholder) for message in messages)


@attrs.define
class MultimodalData:
    """A vision-language model's processing of dataset rows: its family (from the plugin
    answering ``multimodal_model``), its processor and the ids of its image tokens."""

    family: MultimodalModel
    processor: Any
    vision_token_ids: frozenset[int]

    def encode(
        self,
        messages: Sequence[Mapping[str, str]],
        images: Any,
        *,
        origin: str,
        prompt_key: str,
        image_key: str,
        folder: Path | None,
        use_template: bool,
        render: Any,
        videos: Any = None,
        video_key: str = "videos",
    ) -> EncodedRow:
        """The row's prompt ids and image and video inputs: its ``<image>`` and ``<video>``
        placeholders checked against its images and videos (one line naming the row and the
        columns when they differ), each decoded, the messages rendered by ``render(messages)``
        with each placeholder as the family's image or video text, and the text, images and
        videos run through the processor once."""
        from plugrl.data.video import decode_video

        values = _image_list(images, origin, image_key)
        video_values = _image_list(videos, origin, video_key)
        for placeholder, found, column, what in (
            (IMAGE_PLACEHOLDER, len(values), image_key, "images"),
            (VIDEO_PLACEHOLDER, len(video_values), video_key, "videos"),
        ):
            placeholders = _count(messages, placeholder)
            if placeholders != found:
                raise DataError(
                    f"{origin}: {placeholders} {placeholder} placeholders in column "
                    f"{prompt_key!r} but {found} {what} in column {column!r}; put one "
                    f"{placeholder} in the messages for each of the row's {what}"
                )
        decoded = [
            decode_image(value, where=f"{origin}: image {i} of column {image_key!r}", folder=folder)
            for i, value in enumerate(values)
        ]
        decoded_videos = [
            decode_video(value, where=f"{origin}: video {i} of column {video_key!r}", folder=folder)
            for i, value in enumerate(video_values)
        ]
        replacements = [(IMAGE_PLACEHOLDER, self.family.image_text())]
        if decoded_videos:
            replacements.append((VIDEO_PLACEHOLDER, self.family.video_text()))
        filled = []
        for message in messages:
            content = message["content"]
            for placeholder, text in replacements:
                content = content.replace(placeholder, text)
            filled.append({**message, "content": content})
        text = render(filled)
        video_options: dict[str, Any] = {}
        if decoded_videos:
            from transformers.video_utils import VideoMetadata

            video_options = {
                "videos": [video.frames for video in decoded_videos],
                # the frames are sampled already: the processor keeps them all, at their rate
                "video_metadata": [
                    VideoMetadata(
                        total_num_frames=len(video.frames),
                        fps=video.fps,
                        frames_indices=list(range(len(video.frames))),
                    )
                    for video in decoded_videos
                ],
                "do_sample_frames": False,
            }
        processed = self.processor(
            text=[text],
            images=decoded or None,
            return_tensors="pt",
            add_special_tokens=not use_template,
            **video_options,
        )
        ids = processed["input_ids"][0].tolist()
        if not decoded and not decoded_videos:
            return EncodedRow(ids, None, 0)
        keys = (self.family.input_keys if decoded else ()) + (
            self.family.video_input_keys if decoded_videos else ()
        )
        inputs = {key: _as_tensor(processed[key]) for key in keys if key in processed}
        encoded = tuple(
            encoded_image(value, image, folder=folder)
            for value, image in zip(values, decoded, strict=True)
        )
        return EncodedRow(
            ids,
            inputs,
            len(decoded),
            encoded,
            num_videos=len(decoded_videos),
            videos=tuple(video.encoded() for video in decoded_videos),
        )

    def fit_length(
        self,
        row: EncodedRow,
        *,
        origin: str,
        image_key: str,
        limit: int,
        truncation: str,
        filter_overlong: bool,
        video_key: str = "videos",
    ) -> list[int] | None:
        """A prompt with images or videos within ``limit`` tokens: as it is; ``None`` when
        ``filter_overlong`` drops it; cut as ``truncation`` says where the cut keeps every
        image and video token; otherwise one line naming the row, the columns and the fixes."""
        from plugrl.data.dataset import truncate

        ids = row.prompt_ids
        if len(ids) <= limit:
            return ids
        if filter_overlong:
            return None
        image_tokens = sum(1 for token in ids if token in self.vision_token_ids)
        if truncation != "error":
            cut = truncate(ids, limit, truncation)
            if sum(1 for token in cut if token in self.vision_token_ids) == image_tokens:
                return cut
        why = (
            f"data.truncation={truncation} would cut through its images' tokens"
            if truncation != "error"
            else f"over data.max_prompt_length={limit}"
        )
        expanded = [
            f"the {count} {what} of column {column!r}"
            for count, what, column in (
                (row.num_images, "images", image_key),
                (row.num_videos, "videos", video_key),
            )
            if count
        ]
        smaller = "use smaller or fewer-frame videos" if row.num_videos else "use smaller images"
        raise DataError(
            f"{origin}: prompt is {len(ids)} tokens with {' and '.join(expanded)} expanded "
            f"({image_tokens} vision tokens), {why}; raise data.max_prompt_length, {smaller}, "
            "or set data.filter_overlong_prompts=true"
        )


def load_multimodal(
    model: ModelConfig, tokenizer: Any, plugins: PluginManager
) -> MultimodalData | None:
    """The processing of ``model.path`` when it is a vision-language model (its config has a
    ``vision_config``), else ``None``. The model family comes from the plugin answering the
    ``multimodal_model`` hook for the config's ``model_type``; a vision model no plugin
    answers for is a one-line :class:`DataError` naming the type."""
    from transformers import AutoConfig

    if not model.path or not Path(model.path).is_dir():
        return None
    hf_config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    family = multimodal_family(str(model.path), hf_config, plugins)
    if family is None:
        return None
    return MultimodalData(
        family=family,
        processor=family.processor(tokenizer),
        vision_token_ids=frozenset(family.vision_token_ids(tokenizer)),
    )


def multimodal_family(
    model_path: str, hf_config: Any, plugins: PluginManager
) -> MultimodalModel | None:
    """The :class:`MultimodalModel` of the model in ``model_path`` with Hugging Face config
    ``hf_config``, from the plugin answering ``multimodal_model`` for its type; ``None`` for a
    model without a ``vision_config``."""
    if getattr(hf_config, "vision_config", None) is None:
        return None
    return _family_class(hf_config.model_type, plugins)(model_path, hf_config)


def _family_class(model_type: str, plugins: PluginManager) -> type[MultimodalModel]:
    family_class = plugins.hook.multimodal_model(model_type=model_type)
    if family_class is None:
        raise DataError(
            f"model.path is a vision-language model of type {model_type!r}, which no installed "
            "plugin supports; install a plugin that implements the multimodal_model hook for it"
        )
    if not (isinstance(family_class, type) and issubclass(family_class, MultimodalModel)):
        raise DataError(
            f"the multimodal_model hook returned {family_class!r} for {model_type!r}; it must "
            "return a subclass of plugrl.api.data.MultimodalModel"
        )
    return family_class


def model_inputs(
    rows: Sequence[Mapping[str, torch.Tensor] | None], device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """The image and video inputs of a micro-batch's rows, in row order, as one model call
    takes them: each key's tensors joined along their first dimension over the rows that have
    it (all images' patches one after the other, one grid row per image; the same for
    videos); rows without any (``None``) add nothing, and a micro-batch without any gives
    ``{}``."""
    import torch

    present = [row for row in rows if row is not None]
    if not present:
        return {}
    # a row may hold images, videos or both: each key joins the rows that have it
    keys = list(dict.fromkeys(key for row in present for key in row))
    joined = {key: torch.cat([row[key] for row in present if key in row]) for key in keys}
    if device is not None:
        joined = {key: tensor.to(device) for key, tensor in joined.items()}
    return joined


def add_model_positions(batch: Batch, family: MultimodalModel | None) -> Batch:
    """``batch`` with ``position_ids`` ``[B, k, P+R]`` computed by the model over each whole
    sequence (prompt and response), when it has :data:`MULTIMODAL_COLUMN` and ``family``;
    otherwise unchanged."""
    if family is None or MULTIMODAL_COLUMN not in batch:
        return batch
    batch["position_ids"] = family.position_ids(
        batch["input_ids"], batch["attention_mask"], list(batch[MULTIMODAL_COLUMN])
    )
    return batch


def _first_submodule(model: Any, names: Sequence[str], what: str, attribute: str) -> Any:
    """The first of the submodule paths ``names`` that ``model`` has; a ValueError naming the
    model family's ``attribute`` (of :class:`MultimodalModel`) when it has none."""
    for name in names:
        try:
            return model.get_submodule(name)
        except AttributeError:
            continue
    raise ValueError(
        f"{type(model).__name__} has none of the submodules {', '.join(names)}; its model "
        f"family must name its {what} (MultimodalModel.{attribute})"
    )
