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


# --------------------------------------------------- concat of batches of different widths

PAD = 7


def rollout(prompts, responses):
    """One response per prompt, assembled by build_rollout_batch (which records the layout)."""
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.parts.rollout import Completion

    ids, mask = left_pad(prompts, PAD)
    completions = [
        Completion(
            token_ids=list(tokens),
            log_probs=[-1.0] * len(tokens),
            finish_reason="stop",
            prompt_index=i,
        )
        for i, tokens in enumerate(responses)
    ]
    prompt_batch = Batch({"prompts": ids, "prompt_attention_mask": mask}, {"row": range(len(ids))})
    batch = build_rollout_batch(prompt_batch, completions, n=1, pad_token_id=PAD)
    # mrope positions: [B, 3, P+R], one (scaled) position per rope section
    batch["position_ids"] = torch.stack([batch["position_ids"] * k for k in (1, 2, 3)], dim=1)
    # a response column with a dimension of its own (top-2 log-probs, say)
    batch["top_log_probs"] = torch.stack([batch["rollout_log_probs"]] * 2, dim=-1)
    batch["score"] = torch.arange(len(ids), dtype=torch.float32)  # one value per row
    return batch


def test_concat_pads_the_mrope_positions_and_wider_response_columns():
    narrow = rollout([[1, 2]], [[3]])
    wide = rollout([[4, 5, 6]], [[8, 9, 10]])
    joined = Batch.concat([narrow, wide])
    # built in one piece the narrow row has the same padding, so positions scale the same way
    whole = rollout([[1, 2], [4, 5, 6]], [[3], [8, 9, 10]])
    whole["score"] = torch.tensor([0.0, 0.0])
    for name in whole.tensors:
        assert joined[name].tolist() == whole[name].tolist(), name
    assert joined["position_ids"][0].tolist() == [
        [0, 0, 1, 2, 2, 2],
        [0, 0, 2, 4, 4, 4],
        [0, 0, 3, 6, 6, 6],
    ]
    assert joined["input_ids"][0].tolist() == [PAD, 1, 2, 3, PAD, PAD]
    assert joined.meta == {"prompt_width": 3, "response_width": 3, "pad_token_id": PAD}


def test_concat_of_batches_without_a_layout_needs_one_width():
    narrow, wide = rollout([[1, 2]], [[3]]), rollout([[4, 5, 6]], [[8, 9, 10]])
    wide.meta.clear()
    with pytest.raises(ValueError) as info:
        Batch.concat([narrow, wide])
    assert str(info.value) == (
        "cannot concat column 'prompts' of widths 2 and 3: batch 1 records no layout "
        "(prompt_width, response_width, pad_token_id in meta, as build_rollout_batch writes "
        "them) to pad by"
    )
    # of one width, they need none
    same = rollout([[4, 5]], [[8]])
    same.meta.clear()
    assert Batch.concat([narrow, same])["input_ids"].tolist() == [[1, 2, 3], [4, 5, 8]]


def test_concat_refuses_a_column_whose_padding_is_unknown():
    narrow, wide = rollout([[1, 2]], [[3]]), rollout([[4, 5, 6]], [[8, 9, 10]])
    narrow["extra"], wide["extra"] = torch.zeros(1, 4), torch.zeros(1, 5)
    with pytest.raises(ValueError) as info:
        Batch.concat([narrow, wide])
    assert str(info.value) == (
        "cannot concat column 'extra' of widths 4 and 5: it is not response-wide (1 and 3) in "
        "every batch, so its padding is unknown"
    )


def test_concat_refuses_batches_with_different_pads_or_a_stale_layout():
    narrow, wide = rollout([[1, 2]], [[3]]), rollout([[4, 5, 6]], [[8, 9, 10]])
    wide.meta["pad_token_id"] = 0
    with pytest.raises(ValueError) as info:
        Batch.concat([narrow, wide])
    assert str(info.value) == "cannot concat batches padded with different pad token ids (0 and 7)"
    wide.meta["pad_token_id"] = PAD
    wide["input_ids"] = wide["input_ids"][:, :-1]
    with pytest.raises(ValueError) as info:
        Batch.concat([narrow, wide])
    assert str(info.value) == (
        "column 'input_ids' is 5 wide, but its batch's meta says prompt_width 3 and "
        "response_width 3"
    )


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
