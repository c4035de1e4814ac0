import math

import pytest
import torch

from plugrl.algorithms.functional import (
    LossAggregator,
    count_valid,
    loss_scale_from_mask,
    masked_mean,
    masked_whiten,
    sum_norm_divisor,
)
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import LossScale

# row 0: tokens 1, 2 valid; row 1: token 4 valid; row 2: empty response
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])

EXPECTED = {
    "token-mean": 7 / 3,  # (1 + 2 + 4) / 3 tokens
    "token-sum": 7.0,
    "seq-mean-token-sum": 3.5,  # (3 + 4) / 2 non-empty responses
    "seq-mean-token-mean": 2.75,  # (3/2 + 4/1) / 2
    "seq-mean-token-sum-norm": 3.5 / 3,  # / mask width when no max length is given
}


@pytest.mark.parametrize("mode", EXPECTED)
def test_whole_batch_values(mode):
    assert float(LossAggregator(mode)(VALUES, MASK)) == pytest.approx(EXPECTED[mode])


def test_sum_norm_divides_by_the_max_response_length():
    scale = LossScale(num_tokens=3, num_seqs=2, max_response_length=7)
    value = LossAggregator("seq-mean-token-sum-norm", scale)(VALUES, MASK)
    assert float(value) == pytest.approx(3.5 / 7)


def test_sum_norm_divides_by_the_loss_scale_factor_when_set():
    scale = LossScale(num_tokens=3, num_seqs=2, max_response_length=7, loss_scale_factor=10)
    value = LossAggregator("seq-mean-token-sum-norm", scale)(VALUES, MASK)
    assert float(value) == pytest.approx(3.5 / 10)


@pytest.mark.parametrize(
    ("max_response_length", "loss_scale_factor", "divisor"),
    [(None, None, 3), (7, None, 7), (7, 5, 5), (None, 4096, 4096)],
)
def test_sum_norm_divisor(max_response_length, loss_scale_factor, divisor):
    scale = LossScale(
        num_tokens=3,
        num_seqs=2,
        max_response_length=max_response_length,
        loss_scale_factor=loss_scale_factor,
    )
    assert sum_norm_divisor(scale, mask_width=3) == divisor


@pytest.mark.parametrize("mode", EXPECTED)
def test_micro_batch_and_rank_shares_add_up(mode):
    # two ranks, each with one micro-batch per row: the mean over ranks of the summed shares
    scale = LossScale(num_tokens=3, num_seqs=2, dp_size=2, max_response_length=3)
    aggregate = LossAggregator(mode, scale)
    rank0 = aggregate(VALUES[:1], MASK[:1])
    rank1 = aggregate(VALUES[1:2], MASK[1:2]) + aggregate(VALUES[2:], MASK[2:])
    assert float((rank0 + rank1) / 2) == pytest.approx(EXPECTED[mode])


def test_token_mean_share_of_one_micro_batch():
    scale = LossScale(num_tokens=3, num_seqs=2, dp_size=2)
    # rank 0 holds tokens 1 and 2: 2 * (1 + 2) / 3
    assert float(LossAggregator("token-mean", scale)(VALUES[:1], MASK[:1])) == pytest.approx(2.0)


@pytest.mark.parametrize("mode", EXPECTED)
def test_all_empty_responses_give_zero_not_nan(mode):
    empty = torch.zeros_like(MASK)
    value = LossAggregator(mode)(VALUES, empty)
    assert float(value) == 0.0


def test_values_outside_the_mask_do_not_leak():
    poisoned = VALUES.clone()
    poisoned[0, 2] = float("nan")
    poisoned[2, 0] = float("inf")
    for mode, expected in EXPECTED.items():
        assert float(LossAggregator(mode)(poisoned, MASK)) == pytest.approx(expected)


def test_unknown_mode_is_a_recipe_error():
    with pytest.raises(RecipeError, match=r"actor.loss_agg_mode: unknown loss aggregation 'mean'"):
        LossAggregator("mean")


def test_with_mode_keeps_the_scale():
    scale = LossScale(num_tokens=3, num_seqs=2, dp_size=2)
    switched = LossAggregator("token-mean", scale).with_mode("seq-mean-token-sum")
    assert switched == LossAggregator("seq-mean-token-sum", scale)


def test_token_share():
    scale = LossScale(num_tokens=3, num_seqs=2, dp_size=2)
    assert LossAggregator("token-sum", scale).token_share(MASK[:1]) == pytest.approx(4 / 3)


def test_counts_and_scale_from_mask():
    assert count_valid(MASK) == (3, 2)
    assert loss_scale_from_mask(MASK, dp_size=4, max_response_length=8) == LossScale(
        num_tokens=3, num_seqs=2, dp_size=4, max_response_length=8
    )


def test_masked_mean_of_empty_mask_is_zero():
    assert float(masked_mean(VALUES, torch.zeros_like(MASK))) == 0.0
    per_row = masked_mean(VALUES, MASK, dim=-1)
    assert per_row.tolist() == pytest.approx([1.5, 4.0, 0.0])


def test_masked_whiten_uses_the_unbiased_variance():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased variance ((-1)^2 + 0 + 1^2) / 2 = 1
    whitened = masked_whiten(values, mask)[0, :3]
    assert whitened.tolist() == pytest.approx(
        [-1 / math.sqrt(1 + 1e-8), 0.0, 1 / math.sqrt(1 + 1e-8)]
    )


def test_masked_whiten_with_one_valid_value_only_centres():
    values = torch.tensor([[5.0, 7.0]])
    whitened = masked_whiten(values, torch.tensor([[1, 0]]))
    assert whitened[0, 0].item() == 0.0
