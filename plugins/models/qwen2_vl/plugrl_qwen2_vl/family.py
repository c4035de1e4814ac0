"""The Qwen2-VL family's processor, image tokens and M-RoPE position ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import torch

from plugrl.api import DataError
from plugrl.api.data import MultimodalModel

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""The special tokens a Qwen2-VL tokenizer needs for images and videos."""

IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
"""One image in a Qwen2-VL prompt before the processor expands ``<|image_pad|>`` to one token
per merged patch."""

VIDEO_TEXT = "<|vision_start|><|video_pad|><|vision_end|>"
"""One video in a Qwen2-VL prompt before the processor expands ``<|video_pad|>`` to one token
per merged patch of each pair of frames."""

# the token types get_rope_index reads (where it takes them): text 0, image 1, video 2
_IMAGE_TYPE, _VIDEO_TYPE = 1, 2


def _processor_class(model_type: str) -> type:
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

    return Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor


def assemble_processor(model_path: str, model_type: str, tokenizer: Any) -> Any:
    """The model's processor built from its parts: ``tokenizer``, the folder's image
    processor with the PIL backend, and the PIL video processor
    (:class:`plugrl_qwen2_vl.video.PilVideoProcessor`) in place of transformers' (which needs
    torchvision).

    The processor class checks every part's class on construction, and looking up the video
    processor's class needs torchvision; the subclass skips the check for that part, and
    nothing else changes."""
    from transformers import AutoImageProcessor

    from plugrl_qwen2_vl.video import PilVideoProcessor

    base = _processor_class(model_type)

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument is None or isinstance(argument, PilVideoProcessor):
            return None
        return base.check_argument_for_proper_class(self, argument_name, argument)

    with_pil_video = type(
        f"{base.__name__}WithPilVideo",
        (base,),
        {"check_argument_for_proper_class": check_argument_for_proper_class},
    )
    try:
        image_processor = AutoImageProcessor.from_pretrained(model_path, backend="pil")
    except TypeError:  # transformers before the backend argument chose it with use_fast
        image_processor = AutoImageProcessor.from_pretrained(model_path, use_fast=False)
    return with_pil_video(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=PilVideoProcessor.from_folder(model_path),
        chat_template=getattr(tokenizer, "chat_template", None),
    )


class Qwen2VLFamily(MultimodalModel):
    """Qwen2-VL and Qwen2.5-VL (``qwen2_vl``, ``qwen2_5_vl``)."""

    input_keys = ("pixel_values", "image_grid_thw")
    video_input_keys = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    """``second_per_grid_ts`` (Qwen2.5-VL's: seconds per temporal patch, which spaces a
    video's temporal positions) is absent for Qwen2-VL, whose processor gives none."""

    def processor(self, tokenizer: Any) -> Any:
        """``AutoProcessor`` of the folder with the run's tokenizer where it loads; else
        (no torchvision that loads, as on CPU builds of torch that no torchvision matches) the
        processor assembled from the tokenizer and the PIL image processor."""
        from transformers import AutoProcessor

        missing = [t for t in VISION_TOKENS[:3] if t not in tokenizer.get_vocab()]
        if missing:
            raise DataError(
                f"the tokenizer of {self.model_path} has no {', '.join(missing)} token; use the "
                "vision model's own tokenizer (model.tokenizer_path)"
            )
        try:
            return AutoProcessor.from_pretrained(self.model_path, tokenizer=tokenizer)
        except ImportError:
            return assemble_processor(self.model_path, self.hf_config.model_type, tokenizer)

    def image_text(self) -> str:
        return IMAGE_TEXT

    def video_text(self) -> str:
        return VIDEO_TEXT

    def dummy_image(self) -> tuple[list[int], dict[str, Any]]:
        """One merged patch of zeros: ``<|vision_start|><|image_pad|><|vision_end|>`` and
        the ``merge x merge`` patches it stands for."""
        config = self.hf_config
        vision = config.vision_config
        merge = vision.spatial_merge_size
        patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        ids = [config.vision_start_token_id, config.image_token_id, config.vision_end_token_id]
        return ids, {
            "pixel_values": torch.zeros(merge * merge, patch),
            "image_grid_thw": torch.tensor([[1, merge, merge]]),
        }

    def dummy_video(self) -> tuple[list[int], dict[str, Any]]:
        """One merged patch of zeros as a video of one temporal patch (Qwen2.5-VL's with its
        seconds per temporal patch, which only it takes)."""
        ids, image = self.dummy_image()
        config = self.hf_config
        inputs: dict[str, Any] = {
            "pixel_values_videos": image["pixel_values"],
            "video_grid_thw": image["image_grid_thw"],
        }
        if config.model_type == "qwen2_5_vl":
            inputs["second_per_grid_ts"] = torch.tensor([1.0])
        return [ids[0], config.video_token_id, ids[2]], inputs

    def vision_token_ids(self, tokenizer: Any) -> frozenset[int]:
        config = self.hf_config
        return frozenset(
            int(token_id)
            for token_id in (
                config.image_token_id,
                config.video_token_id,
                config.vision_start_token_id,
                config.vision_end_token_id,
            )
            if token_id is not None
        )

    def expand_image_tokens(
        self, token_ids: Sequence[int], inputs: Mapping[str, torch.Tensor]
    ) -> list[int]:
        """Each ``<|image_pad|>`` repeated once per merged patch of its image (its grid's
        size over ``spatial_merge_size**2``), as the processor expands it; each
        ``<|video_pad|>`` likewise by its video's grid."""
        config = self.hf_config
        merge = config.vision_config.spatial_merge_size**2
        counts: dict[int, Any] = {}
        for token_id, grid_key, text, what in (
            (config.image_token_id, "image_grid_thw", IMAGE_TEXT, "image"),
            (config.video_token_id, "video_grid_thw", VIDEO_TEXT, "video"),
        ):
            grids = inputs.get(grid_key)
            sizes = [] if grids is None else [int(grid.prod()) // merge for grid in grids]
            placeholders = sum(1 for token in token_ids if token == token_id)
            if placeholders != len(sizes):
                raise DataError(
                    f"the prompt holds {placeholders} {what} placeholders for {len(sizes)} "
                    f"{what}s; put one {text} in it for each {what}"
                )
            counts[token_id] = iter(sizes)
        expanded: list[int] = []
        for token in token_ids:
            if token in counts:
                expanded.extend([token] * next(counts[token]))
            else:
                expanded.append(token)
        return expanded

    @cached_property
    def _rope_model(self) -> Any:
        """The model's base module with no weights (on the meta device): only its
        ``get_rope_index`` is used, which reads the config."""
        from transformers import AutoModel

        with torch.device("meta"):
            return AutoModel.from_config(self.hf_config)

    def position_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        inputs: Sequence[Mapping[str, torch.Tensor] | None],
    ) -> torch.Tensor:
        """``[B, 3, L]``: the model's ``get_rope_index`` over the whole sequences (temporal,
        height and width positions; text tokens have the same position in all three, each
        image's tokens their place in its grid), 0 on padding."""
        config = self.hf_config
        merge = config.vision_config.spatial_merge_size**2
        for row, (ids, inputs_of_row) in enumerate(zip(input_ids, inputs, strict=True)):
            present = ids[attention_mask[row].bool()]
            for token_id, grid_key, what in (
                (config.image_token_id, "image_grid_thw", "image"),
                (config.video_token_id, "video_grid_thw", "video"),
            ):
                tokens = int((present == token_id).sum())
                grid = None if inputs_of_row is None else inputs_of_row.get(grid_key)
                expected = 0 if grid is None else int(grid.prod(-1).sum()) // merge
                # more tokens than the row's grids expand to: a response sampled the token;
                # left in, get_rope_index would look for a grid there is none of
                if tokens != expected:
                    raise ValueError(
                        f"row {row} holds {tokens} {what} tokens but its {what}s expand to "
                        f"{expected}: a response sampled the {what} token, which the model "
                        "cannot be trained on; train from a checkpoint that does not sample it"
                    )
        rows = [row for row in inputs if row is not None]

        def joined(key: str) -> torch.Tensor | None:
            parts = [row[key] for row in rows if key in row]
            return torch.cat(parts).to(input_ids.device) if parts else None

        options: dict[str, Any] = {
            "image_grid_thw": joined("image_grid_thw"),
            "video_grid_thw": joined("video_grid_thw"),
            "attention_mask": attention_mask,
        }
        seconds = joined("second_per_grid_ts")
        if seconds is not None:
            options["second_per_grid_ts"] = seconds
        if self._rope_takes_token_types:
            # newer transformers read each token's modality from here, older from the ids
            token_types = (input_ids == config.image_token_id).long() * _IMAGE_TYPE
            token_types += (input_ids == config.video_token_id).long() * _VIDEO_TYPE
            options["mm_token_type_ids"] = token_types
        positions, _ = self._rope_model.get_rope_index(input_ids, **options)
        return positions.permute(1, 0, 2).contiguous()

    @cached_property
    def _rope_takes_token_types(self) -> bool:
        import inspect

        parameters = inspect.signature(self._rope_model.get_rope_index).parameters
        return "mm_token_type_ids" in parameters
