import pickle

import numpy as np
import pytest
import torch

from plugrl.data.batch import Batch, left_pad


def make(rows=4):
    return Batch(
        tensors={"responses": torch.arange(rows * 3).reshape(rows, 3)},
        columns={
            "uid": [f"u{i // 2}" for i in range(rows)],
            "extra_info": [{"i": i} for i in range(rows)],
        },
        meta={"temperature": 1.0},
    )


def test_length_access_and_missing_column_message():
    batch = make()
    assert len(batch) == 4 and "uid" in batch and batch.keys() == ["responses", "uid", "extra_info"]
    assert batch["extra_info"][2] == {"i": 2}
    with pytest.raises(
        KeyError, match="batch has no column 'values'; it has responses, uid, extra_info"
    ):
        batch["values"]


def test_columns_must_share_the_batch_dimension():
    batch = make()
    with pytest.raises(ValueError, match="column 'values' has 3 rows, the batch has 4"):
        batch["values"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="must have a batch dimension"):
        batch["scalar"] = torch.tensor(1.0)
    batch["responses"] = torch.zeros(4, 5)  # replacing a column may change its other dims
    assert batch["responses"].shape == (4, 5)


def test_require_names_every_missing_column():
    with pytest.raises(KeyError, match="gae needs batch columns values, returns; the batch has"):
        make().require("responses", "values", "returns", by="gae")


def test_select_split_chunk_repeat_concat():
    batch = make()
    picked = batch.select([3, 0])
    assert picked["responses"][:, 0].tolist() == [9, 0] and list(picked["uid"]) == ["u1", "u0"]
    masked = batch.select(np.array([True, False, False, True]))
    assert len(masked) == 2 and masked.meta == {"temperature": 1.0}
    assert [len(b) for b in batch.split(3)] == [3, 1]
    assert [len(b) for b in batch.chunk(2)] == [2, 2]
    with pytest.raises(ValueError, match="cannot split 4 rows into 3 equal chunks"):
        batch.chunk(3)
    repeated = batch.select([0, 1]).repeat(2)
    assert list(repeated["uid"]) == ["u0", "u0", "u0", "u0"]
    assert repeated["responses"][:, 0].tolist() == [0, 0, 3, 3]
    tiled = batch.select([0, 2]).repeat(2, interleave=False)
    assert tiled["responses"][:, 0].tolist() == [0, 6, 0, 6]
    joined = Batch.concat(batch.split(3))
    assert torch.equal(joined["responses"], batch["responses"])
    assert list(joined["uid"]) == list(batch["uid"])


def test_concat_requires_the_same_columns():
    other = make(2)
    other.pop("uid")
    with pytest.raises(ValueError, match="batch 1 has columns"):
        Batch.concat([make(2), other])


def test_union_checks_shared_columns():
    batch = make()
    extra = Batch(tensors={"values": torch.ones(4, 3), "responses": batch["responses"]})
    merged = batch.union(extra)
    assert "values" in merged and "values" not in batch
    with pytest.raises(ValueError, match="column 'responses' differs"):
        batch.union(Batch(tensors={"responses": torch.zeros(4, 3)}))
    with pytest.raises(ValueError, match="cannot union batches of 4 and 2 rows"):
        batch.union(make(2))


def test_pickles_for_the_object_store():
    batch = make()
    again = pickle.loads(pickle.dumps(batch))
    assert torch.equal(again["responses"], batch["responses"])
    assert list(again["uid"]) == list(batch["uid"]) and again.meta == batch.meta


def test_columns_of_lists_stay_one_object_per_row():
    batch = Batch(columns={"raw_prompt_ids": [[1, 2], [3]]})
    assert batch["raw_prompt_ids"].shape == (2,) and batch["raw_prompt_ids"][0] == [1, 2]


def test_left_pad_puts_tokens_at_the_right_end_and_masks_the_padding():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    assert left_pad([], pad_token_id=0)[0].shape == (0, 0)
