import pytest
import torch

from plugrl.cluster.base import average_metrics, concat_outputs, split_for_dp, unpad
from plugrl.data.batch import Batch


def rows(n: int) -> Batch:
    return Batch({"row_id": torch.arange(n)}, {"uid": [f"u{i}" for i in range(n)]})


def ids(batch: Batch) -> list[int]:
    return batch["row_id"].tolist()


def test_split_gives_each_rank_consecutive_rows():
    shards, padding = split_for_dp(rows(6), 3)
    assert padding == 0
    assert [ids(s) for s in shards] == [[0, 1], [2, 3], [4, 5]]
    assert list(shards[1]["uid"]) == ["u2", "u3"]


def test_split_deals_each_mini_batch_across_ranks():
    # two mini-batches of 4 rows over 2 ranks: rank r's i-th local mini-batch is half of the
    # batch's i-th mini-batch, as it would be on one rank
    shards, _ = split_for_dp(rows(8), 2, mini_batch_size=4)
    assert [ids(s) for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_split_falls_back_to_consecutive_rows_when_mini_batches_do_not_fit():
    shards, _ = split_for_dp(rows(6), 2, mini_batch_size=4)
    assert [ids(s) for s in shards] == [[0, 1, 2], [3, 4, 5]]


def test_uneven_split_is_refused_unless_padding_is_allowed():
    with pytest.raises(ValueError) as info:
        split_for_dp(rows(5), 2)
    assert str(info.value) == (
        "a batch of 5 rows cannot be split evenly over 2 data-parallel ranks; make "
        "data.train_batch_size x rollout.n a multiple of 2"
    )
    shards, padding = split_for_dp(rows(5), 4, pad=True)
    assert padding == 3
    assert [ids(s) for s in shards] == [[0, 1], [2, 3], [4, 0], [1, 2]]


def test_concat_then_unpad_restores_the_original_rows():
    shards, padding = split_for_dp(rows(5), 2, pad=True)
    outputs = [{"log_probs": s["row_id"].float()} for s in shards]
    joined = unpad(concat_outputs(outputs), padding)
    assert joined["log_probs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert unpad(concat_outputs([s["row_id"] for s in shards]), padding).tolist() == [0, 1, 2, 3, 4]
    assert ids(unpad(concat_outputs(shards), padding)) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="cannot concatenate outputs of type str"):
        concat_outputs(["a", "b"])


def test_metrics_are_averaged_over_the_ranks_that_report_them():
    merged = average_metrics([{"a": 1.0, "b": 4.0}, {"a": 3.0}, {"a": 5.0, "b": 6.0}])
    assert merged == {"a": 3.0, "b": 5.0}
