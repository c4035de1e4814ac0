"""The samples dump's file writing and JSON-safe values (the runs that write it are tested
with the schedulers, tests/plugins/schedulers/test_samples_dump.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from plugrl.run.sample_dump import json_safe, write_jsonl


def test_values_become_plain_json():
    row = {
        "tensor": torch.tensor([1.5, float("nan")]),
        "scalar": torch.tensor(2),
        "numpy": np.float32(0.5),
        "array": np.array([[1, 2]]),
        "nan": float("nan"),
        "inf": float("-inf"),
        "nested": {1: (True, None, {"x"})},
        "other": object,
    }
    assert json_safe(row) == {
        "tensor": [1.5, None],
        "scalar": 2,
        "numpy": 0.5,
        "array": [[1, 2]],
        "nan": None,
        "inf": None,
        "nested": {"1": [True, None, ["x"]]},
        "other": str(object),
    }


def test_a_file_is_replaced_whole(tmp_path):
    path = write_jsonl(tmp_path / "dump" / "3.jsonl", [{"a": 1}, {"b": "é"}])
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "é"}\n'
    write_jsonl(path, [{"a": 2}])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 2}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["3.jsonl"]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = write_jsonl(tmp_path / "1.jsonl", [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise KeyboardInterrupt  # killed while writing

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, rows())
    assert path.read_text() == '{"a": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["1.jsonl"]
