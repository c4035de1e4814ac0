"""Rows of the vision-language data tests, read the way a run reads its training file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from plugrl.data.dataset import PromptDataset
from plugrl.recipe import DataConfig


def dataset(
    tmp_path: Path, rows: list[dict], vision: tuple[Any, Any], **data: Any
) -> tuple[PromptDataset, DataConfig]:
    """``rows`` written to ``tmp_path/train.parquet`` and read as the training set, one batch
    of them all; ``vision`` is the ``vision`` fixture, ``data`` more ``data.*`` keys."""
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = DataConfig(train_files=[str(path)], train_batch_size=len(rows), **data)
    tokenizer, multimodal = vision
    return PromptDataset.train(config, tokenizer, multimodal), config
