from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from plugrl_tools.quickstart import save_untrained_model

    folder = save_untrained_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
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
