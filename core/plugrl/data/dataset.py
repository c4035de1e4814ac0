"""Prompt datasets in verl's parquet schema, and the stateful loader that batches them.

A row holds ``data_source`` (which reward function scores it), ``prompt`` (chat messages
``[{"role", "content"}, ...]``; ``data.prompt_key`` names the column), ``ability``,
``reward_model`` (a struct with ``ground_truth``) and ``extra_info`` (any struct). Every prompt
is rendered with the tokenizer's chat template and tokenized when the dataset is built, so bad
data stops a run at start-up with a :class:`~plugrl.errors.DataError` naming the file, the row
(counting from 0) and the fix.

:class:`PromptLoader` hands out :class:`~plugrl.data.batch.Batch` objects of
``data.train_batch_size`` prompts. Its whole state is (epoch, position): the order of an epoch
is a permutation seeded by ``(data.seed, epoch)``, so a loader restored from
:meth:`PromptLoader.state_dict` yields exactly the batches the original would have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from plugrl.errors import DataError

if TYPE_CHECKING:
    from plugrl.data.batch import Batch
    from plugrl.data.multimodal import MultimodalData
    from plugrl.recipe import DataConfig, ModelConfig

logger = logging.getLogger("plugrl.data")

TRUNCATION_MODES = ("error", "left", "right", "middle")


@attrs.frozen
class PromptRecord:
    """One prompt, tokenized, with what the reward needs."""

    index: int
    """Position in the dataset (after over-long prompts were filtered)."""
    prompt_ids: tuple[int, ...]
    data_source: str
    ground_truth: Any
    extra_info: Any
    ability: Any
    origin: str
    """``<file> row <n>``, for messages about this row."""
    messages: tuple[dict[str, str], ...] = ()
    """The row's chat messages, before any template: what a reward model re-renders with its
    own template."""
    agent_name: str | None = None
    """The row's agent loop (verl's ``agent_name`` column), over ``rollout.agent.loop``."""
    multi_modal_inputs: Mapping[str, Any] | None = None
    """The model's image inputs for the row's images (computed once, when the dataset is
    built), ``None`` for a row without images."""
    images: tuple[bytes, ...] = ()
    """The row's images as encoded bytes, in placeholder order (empty without images): what
    an engine that runs the model's processor itself (vLLM, SGLang) decodes."""
    videos: tuple[dict[str, Any], ...] = ()
    """The row's videos as sampled frames (PNG bytes) and their rate, in placeholder order
    (empty without videos), for the same engines."""


def truncate(ids: Sequence[int], limit: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``limit`` tokens: ``left`` keeps the end, ``right`` the start,
    ``middle`` keeps both ends (the start gets the smaller half when ``limit`` is odd)."""
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    if mode == "left":
        return ids[len(ids) - limit :]
    if mode == "right":
        return ids[:limit]
    if mode == "middle":
        head = limit // 2
        tail = limit - head
        return ids[:head] + (ids[len(ids) - tail :] if tail else [])
    raise ValueError(f"truncation mode {mode!r} is not one of {', '.join(TRUNCATION_MODES)}")


def _read_table(path: Path, files_key: str) -> Any:
    import pyarrow.parquet as pq

    if not path.exists():
        raise DataError(f"{files_key}: {path} does not exist; fix the path in {files_key}")
    if path.is_dir():
        raise DataError(f"{files_key}: {path} is a folder; list its parquet files in {files_key}")
    try:
        return pq.read_table(path)
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"{files_key}: cannot read {path} as parquet ({reason}); point {files_key} at "
            "parquet files in verl's schema"
        ) from None


def _messages(value: Any, origin: str, prompt_key: str) -> list[dict[str, str]]:
    """The row's chat messages; a bare string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for message in value:
            if not (
                isinstance(message, Mapping)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                break
            messages.append({"role": message["role"], "content": message["content"]})
        else:
            return messages
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise DataError(
        f"{origin}: column {prompt_key!r} must hold chat messages "
        f'[{{"role": ..., "content": ...}}, ...] or a string, got {shown}; fix the row or '
        "set data.prompt_key to the column with the messages"
    )


def _ground_truth(value: Any, origin: str) -> Any:
    if isinstance(value, Mapping) and value.get("ground_truth") is not None:
        return value["ground_truth"]
    raise DataError(
        f"{origin}: no reward_model.ground_truth; every row needs reward_model: "
        "{ground_truth: ...}, the answer its reward function checks"
    )


def _render(tokenizer: Any, messages: list[dict[str, str]], use_template: bool) -> str:
    if use_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(message["content"] for message in messages)


def _uses_chat_template(tokenizer: Any, config: DataConfig, files_key: str) -> bool:
    """``data.apply_chat_template``, refused when the tokenizer has no template."""
    if config.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"the tokenizer has no chat template to render {files_key}; use a tokenizer "
            "with one (model.tokenizer_path) or set data.apply_chat_template=false"
        )
    return config.apply_chat_template


_REQUIRED_COLUMNS = (
    ("data_source", "add it: it names the reward function that scores each row"),
    ("reward_model", "add it with a ground_truth field for every row"),
)


@attrs.frozen
class _FileRows:
    """The columns of one parquet file that a dataset reads, one value per row."""

    path: Path
    prompts: list[Any]
    data_sources: list[Any]
    rewards: list[Any]
    extra_infos: list[Any]
    abilities: list[Any]
    agent_names: list[Any]
    images: list[Any] | None
    """The ``data.image_key`` column, ``None`` when the file has none."""
    videos: list[Any] | None = None
    """The ``data.video_key`` column, ``None`` when the file has none."""

    @classmethod
    def read(cls, path: Path, config: DataConfig, files_key: str) -> _FileRows:
        """The file's rows; one line naming the file when it is unreadable or a column it
        needs is missing (the optional ``extra_info`` and ``ability`` are ``None`` then)."""
        table = _read_table(path, files_key)
        columns = table.column_names
        required = (
            (config.prompt_key, "set data.prompt_key to the column with the chat messages"),
            *_REQUIRED_COLUMNS,
        )
        for name, fix in required:
            if name not in columns:
                raise DataError(
                    f"{path} has no column {name!r} (it has {', '.join(columns)}); {fix}"
                )

        def column(name: str) -> list[Any]:
            if name in columns:
                return table.column(name).to_pylist()
            return [None] * table.num_rows

        return cls(
            path,
            prompts=column(config.prompt_key),
            data_sources=column("data_source"),
            rewards=column("reward_model"),
            extra_infos=column("extra_info"),
            abilities=column("ability"),
            agent_names=column("agent_name"),
            images=column(config.image_key) if config.image_key in columns else None,
            videos=column(config.video_key) if config.video_key in columns else None,
        )

    @property
    def origins(self) -> list[str]:
        """``<file> row <n>`` of each row, for messages."""
        return [f"{self.path} row {row}" for row in range(len(self.prompts))]

    def messages(self, config: DataConfig) -> list[list[dict[str, str]]]:
        """Every row's chat messages."""
        return [
            _messages(prompt, origin, config.prompt_key)
            for prompt, origin in zip(self.prompts, self.origins, strict=True)
        ]

    def encode(
        self,
        tokenizer: Any,
        messages: list[list[dict[str, str]]],
        use_template: bool,
    ) -> list[list[int]]:
        """Every prompt's token ids, rendered with the chat template when ``use_template``
        (which adds the special tokens itself)."""
        texts = [_render(tokenizer, chat, use_template) for chat in messages]
        if not texts:
            return []
        return tokenizer(texts, add_special_tokens=not use_template)["input_ids"]

    def encode_with_images(
        self,
        tokenizer: Any,
        multimodal: MultimodalData,
        messages: list[list[dict[str, str]]],
        config: DataConfig,
        use_template: bool,
    ) -> list[Any]:
        """Every row's prompt, checked against its images and videos: an
        :class:`~plugrl.data.multimodal.EncodedRow` (ids with the images and videos expanded,
        their inputs, and the encoded images and videos) per row."""
        images = self.images if self.images is not None else [None] * len(messages)
        videos = self.videos if self.videos is not None else [None] * len(messages)
        return [
            multimodal.encode(
                chat,
                row_images,
                origin=origin,
                prompt_key=config.prompt_key,
                image_key=config.image_key,
                folder=self.path.parent,
                use_template=use_template,
                render=lambda filled: _render(tokenizer, filled, use_template),
                videos=row_videos,
                video_key=config.video_key,
            )
            for chat, row_images, row_videos, origin in zip(
                messages, images, videos, self.origins, strict=True
            )
        ]


def _refuse_images(rows: _FileRows, config: DataConfig) -> None:
    """A file with images in ``data.image_key`` or videos in ``data.video_key`` read for a
    model that is not a vision-language model: one line naming the row and the column."""
    for column, key, what in (
        (rows.images, config.image_key, "images"),
        (rows.videos, config.video_key, "videos"),
    ):
        for row, values in enumerate(column or ()):
            if values is not None and len(values):
                raise DataError(
                    f"{rows.path} row {row}: column {key!r} holds {what}, but model.path is not "
                    "a vision-language model (its config has no vision_config); train a "
                    "vision-language model on this data, or drop the column"
                )


def _fit_length(ids: list[int], origin: str, config: DataConfig) -> list[int] | None:
    """A prompt within ``data.max_prompt_length``: as it is, truncated as
    ``data.truncation`` says, or ``None`` when ``data.filter_overlong_prompts`` drops it; one
    line naming the row when ``data.truncation`` is ``error``."""
    limit = config.max_prompt_length
    if len(ids) <= limit:
        return ids
    if config.filter_overlong_prompts:
        return None
    if config.truncation == "error":
        raise DataError(
            f"{origin}: prompt is {len(ids)} tokens, over data.max_prompt_length={limit}; raise "
            "data.max_prompt_length, set data.truncation to left, right or middle, or set "
            "data.filter_overlong_prompts=true"
        )
    return truncate(ids, limit, config.truncation)


def _data_source(value: Any, origin: str) -> str:
    if not isinstance(value, str) or not value:
        raise DataError(
            f"{origin}: data_source is {value!r}; every row needs the name of its data source "
            "(it chooses the reward function)"
        )
    return value


class PromptDataset:
    """The rows of one or more parquet files, tokenized and checked against ``data``."""

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer: Any,
        config: DataConfig,
        *,
        files_key: str = "data.train_files",
        multimodal: MultimodalData | None = None,
    ) -> None:
        self.files = [Path(f) for f in files]
        self.files_key = files_key
        self.config = config
        if not self.files:
            raise DataError(
                f"{files_key} is empty; set it to one or more parquet files in verl's schema"
            )
        self.has_images = multimodal is not None
        """Whether the rows are read with their images (the model is a vision-language
        model): the batches then have a ``multi_modal_inputs`` column."""
        use_template = _uses_chat_template(tokenizer, config, files_key)
        records: list[PromptRecord] = []
        filtered = 0
        for path in self.files:
            rows = _FileRows.read(path, config, files_key)
            messages = rows.messages(config)
            if multimodal is None:
                _refuse_images(rows, config)
                texts = rows.encode(tokenizer, messages, use_template)
                encoded: list[Any] = [None] * len(texts)
            else:
                encoded = rows.encode_with_images(
                    tokenizer, multimodal, messages, config, use_template
                )
                texts = [encoded_row.prompt_ids for encoded_row in encoded]
            truths = [_ground_truth(r, o) for r, o in zip(rows.rewards, rows.origins, strict=True)]
            for row, encoded_row in enumerate(encoded):
                # a row of a text model, or without images or videos, is its token ids alone
                if encoded_row is None or encoded_row.inputs is None:
                    encoded_row = None
                    fitted = _fit_length(texts[row], rows.origins[row], config)
                else:
                    fitted = multimodal.fit_length(
                        encoded_row,
                        origin=rows.origins[row],
                        image_key=config.image_key,
                        limit=config.max_prompt_length,
                        truncation=config.truncation,
                        filter_overlong=config.filter_overlong_prompts,
                        video_key=config.video_key,
                    )
                if fitted is None:
                    filtered += 1
                    continue
                records.append(
                    PromptRecord(
                        index=len(records),
                        prompt_ids=tuple(fitted),
                        data_source=_data_source(rows.data_sources[row], rows.origins[row]),
                        ground_truth=truths[row],
                        extra_info=rows.extra_infos[row],
                        ability=rows.abilities[row],
                        origin=rows.origins[row],
                        messages=tuple(messages[row]),
                        agent_name=rows.agent_names[row] or None,
                        multi_modal_inputs=None if encoded_row is None else encoded_row.inputs,
                        images=() if encoded_row is None else encoded_row.images,
                        videos=() if encoded_row is None else encoded_row.videos,
                    )
                )
        self._check_filtered(records, filtered)
        self.records = records
        self.num_filtered = filtered

    def _check_filtered(self, records: list[PromptRecord], filtered: int) -> None:
        """Log the prompts ``data.filter_overlong_prompts`` dropped; refuse a dataset left
        without any."""
        limit, files_key = self.config.max_prompt_length, self.files_key
        if filtered:
            logger.info(
                "%s: dropped %d prompts longer than data.max_prompt_length=%d "
                "(data.filter_overlong_prompts)",
                files_key,
                filtered,
                limit,
            )
        if records:
            return
        if filtered:
            raise DataError(
                f"{files_key}: all {filtered} prompts are longer than "
                f"data.max_prompt_length={limit}; raise it or set "
                "data.filter_overlong_prompts=false with a data.truncation mode"
            )
        raise DataError(
            f"{files_key}: {', '.join(map(str, self.files))} hold no rows; point "
            f"{files_key} at files with prompts"
        )

    @classmethod
    def train(
        cls, config: DataConfig, tokenizer: Any, multimodal: MultimodalData | None = None
    ) -> PromptDataset:
        """The dataset of ``data.train_files`` (with their images when ``multimodal``)."""
        return cls(
            config.train_files,
            tokenizer,
            config,
            files_key="data.train_files",
            multimodal=multimodal,
        )

    @classmethod
    def validation(
        cls, config: DataConfig, tokenizer: Any, multimodal: MultimodalData | None = None
    ) -> PromptDataset | None:
        """The dataset of ``data.val_files``, or ``None`` when there are none."""
        if not config.val_files:
            return None
        return cls(
            config.val_files, tokenizer, config, files_key="data.val_files", multimodal=multimodal
        )

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> PromptRecord:
        return self.records[index]


def collate(
    records: Sequence[PromptRecord],
    uids: Sequence[str],
    pad_token_id: int,
    *,
    with_images: bool = False,
) -> Batch:
    """A prompt batch: ``prompts`` [B, P] left-padded to the longest prompt of the batch with
    ``pad_token_id``, ``prompt_attention_mask`` [B, P], and the columns ``uid``, ``index``,
    ``data_source``, ``ground_truth``, ``extra_info``, ``ability``, ``raw_prompt_ids``
    (unpadded lists of ints), ``raw_prompt`` (the chat messages, verl's name) and
    ``agent_name`` (the row's agent loop, ``None`` for ``rollout.agent.loop``).
    ``with_images`` (a dataset read with its images) adds ``multi_modal_inputs``: each row's
    model image and video inputs, ``None`` for a row without either, ``prompt_images``: each
    row's images as encoded bytes, and ``prompt_videos``: each row's videos as sampled frames
    (:meth:`plugrl.data.video.DecodedVideo.encoded`)."""
    from plugrl.data.batch import IMAGES_COLUMN, MULTIMODAL_COLUMN, VIDEOS_COLUMN, Batch, left_pad

    prompts, mask = left_pad([r.prompt_ids for r in records], pad_token_id)
    batch = Batch(
        tensors={"prompts": prompts, "prompt_attention_mask": mask},
        columns={
            "uid": list(uids),
            "index": [r.index for r in records],
            "data_source": [r.data_source for r in records],
            "ground_truth": [r.ground_truth for r in records],
            "extra_info": [r.extra_info for r in records],
            "ability": [r.ability for r in records],
            "raw_prompt_ids": [list(r.prompt_ids) for r in records],
            "raw_prompt": [[dict(m) for m in r.messages] for r in records],
            "agent_name": [r.agent_name for r in records],
        },
    )
    if with_images:
        batch[MULTIMODAL_COLUMN] = [r.multi_modal_inputs for r in records]
        batch[IMAGES_COLUMN] = [r.images for r in records]
        batch[VIDEOS_COLUMN] = [r.videos for r in records]
    return batch


def pad_token_id_of(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id (many chat tokenizers define no pad token)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise DataError(
            "the tokenizer has neither a pad nor an eos token; use a tokenizer that defines one"
        )
    return int(pad)


class PromptLoader:
    """Batches of a :class:`PromptDataset`, epoch after epoch, resumable.

    * ``shuffle``: each epoch's order is a permutation seeded by ``(seed, epoch)``.
    * ``drop_last``: an epoch ends when fewer than ``batch_size`` prompts are left (training);
      otherwise the last batch is smaller (validation).
    * ``uid`` of a row: ``"{uid_prefix}{epoch}-{index}"``, unique across epochs, the same on
      a resumed run.
    """

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        *,
        pad_token_id: int,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
        uid_prefix: str = "",
        batch_size_key: str = "data.train_batch_size",
    ) -> None:
        if batch_size <= 0:
            raise DataError(f"{batch_size_key} must be > 0, got {batch_size}")
        if drop_last and batch_size > len(dataset):
            raise DataError(
                f"{batch_size_key}={batch_size} is more than the {len(dataset)} prompts of "
                f"{dataset.files_key}; lower {batch_size_key} or add prompts"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.uid_prefix = uid_prefix
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(0)

    @classmethod
    def for_training(
        cls,
        dataset: PromptDataset,
        config: DataConfig,
        pad_token_id: int,
        *,
        per_generation_round: bool = False,
    ) -> PromptLoader:
        """``data.train_batch_size`` prompts per batch (``data.gen_batch_size`` with
        ``per_generation_round``, for dynamic sampling), shuffled by ``data.seed``, full
        batches only."""
        key = "gen_batch_size" if per_generation_round else "train_batch_size"
        return cls(
            dataset,
            getattr(config, key),
            pad_token_id=pad_token_id,
            shuffle=config.shuffle,
            seed=config.seed,
            drop_last=True,
            batch_size_key=f"data.{key}",
        )

    @classmethod
    def for_validation(
        cls, dataset: PromptDataset, config: DataConfig, pad_token_id: int
    ) -> PromptLoader:
        """In file order, ``data.val_batch_size`` prompts per batch (unset: all at once)."""
        return cls(
            dataset,
            config.val_batch_size or len(dataset),
            pad_token_id=pad_token_id,
            shuffle=False,
            drop_last=False,
            uid_prefix="val-",
            batch_size_key="data.val_batch_size",
        )

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Dataset indices in the order epoch ``epoch`` visits them."""
        if epoch != self._order_epoch:
            size = len(self.dataset)
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(size)
            else:
                self._order = np.arange(size)
            self._order_epoch = epoch
        return self._order

    def _epoch_done(self) -> bool:
        left = len(self.dataset) - self.position
        return left <= 0 or (self.drop_last and left < self.batch_size)

    def next_batch(self) -> Batch:
        """The next batch, moving on to the next epoch when this one is used up."""
        if self._epoch_done():
            self.epoch += 1
            self.position = 0
        order = self.epoch_order(self.epoch)
        indices = order[self.position : self.position + self.batch_size]
        self.position += len(indices)
        records = [self.dataset[int(i)] for i in indices]
        uids = [f"{self.uid_prefix}{self.epoch}-{record.index}" for record in records]
        batch = collate(
            records, uids, self.pad_token_id, with_images=getattr(self.dataset, "has_images", False)
        )
        batch.meta["epoch"] = self.epoch
        return batch

    def __iter__(self) -> Iterator[Batch]:
        """The batches left in the current epoch (all of them for a fresh epoch). After the
        loop, the next batch comes from the next epoch."""
        if self._epoch_done():
            self.epoch += 1
            self.position = 0
        while not self._epoch_done():
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_prompts": len(self.dataset)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        num_prompts = int(state.get("num_prompts", len(self.dataset)))
        if num_prompts != len(self.dataset):
            raise DataError(
                f"the checkpoint's data loader was over {num_prompts} prompts, "
                f"{self.dataset.files_key} now has {len(self.dataset)}; resume with the same "
                "data files (and filtering) or start fresh with trainer.resume_mode=disable"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


def load_tokenizer(model: ModelConfig) -> Any:
    """The tokenizer of ``model.tokenizer_path`` (unset: ``model.path``), from a local folder."""
    from transformers import AutoTokenizer

    from plugrl.errors import RecipeError

    key = "model.tokenizer_path" if model.tokenizer_path else "model.path"
    path = model.tokenizer_path or model.path
    if not path:
        raise RecipeError(
            "no tokenizer to load; set model.path to a Hugging Face model folder", key
        )
    if not Path(path).is_dir():
        raise RecipeError(f"{path} is not a folder; set a local Hugging Face model folder", key)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=model.trust_remote_code)


def build_loaders(config: DataConfig, tokenizer: Any) -> tuple[PromptLoader, PromptLoader | None]:
    """The training loader of ``data.train_files`` and the validation loader of
    ``data.val_files`` (``None`` without validation files), checked at once."""
    pad = pad_token_id_of(tokenizer)
    train = PromptLoader.for_training(PromptDataset.train(config, tokenizer), config, pad)
    val_dataset = PromptDataset.validation(config, tokenizer)
    val = PromptLoader.for_validation(val_dataset, config, pad) if val_dataset else None
    return train, val
