from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from plugrl.testing import make_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny Qwen2 tokenizer with a ChatML template, saved and loaded back as a run loads it."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    make_tiny_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture
def write_parquet(tmp_path: Path) -> Callable[..., Path]:
    """Write rows (dicts) to a parquet file in the test's folder and return its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    counter = iter(range(1000))

    def write(rows: Sequence[dict[str, Any]], name: str | None = None, schema: Any = None) -> Path:
        path = tmp_path / (name or f"data{next(counter)}.parquet")
        table = (
            pa.Table.from_pylist(list(rows), schema=schema)
            if rows or schema is None
            else pa.Table.from_pylist([], schema=schema)
        )
        pq.write_table(table, path)
        return path

    return write
