import pytest
import torch

from plugrl.errors import RecipeError
from plugrl_plugins.backends.fsdp2.batching import (
    fixed_micro_batches,
    padding_trim,
    token_budget_micro_batches,
)


def test_fixed_micro_batches_cover_rows_in_order():
    assert fixed_micro_batches(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert fixed_micro_batches(4, None) == [[0, 1, 2, 3]]
    assert fixed_micro_batches(0, 2) == []


@pytest.mark.parametrize("budget", [9, 20, 33, 100])
def test_token_budget_keeps_padded_cost_within_budget(budget):
    lengths = [9, 1, 4, 7, 2, 2, 8, 3, 5, 6]
    groups = token_budget_micro_batches(lengths, budget)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        assert len(group) * max(lengths[i] for i in group) <= budget
    # as few micro-batches as consecutive runs of the length-sorted rows allow
    rows, start, count = sorted(lengths, reverse=True), 0, 0
    while start < len(rows):
        start += max(1, budget // rows[start])
        count += 1
    assert len(groups) == count


def test_token_budget_groups_rows_of_similar_length():
    lengths = [10, 1, 10, 1, 10, 1, 10, 1]
    groups = token_budget_micro_batches(lengths, 40)
    assert sorted(sorted(g) for g in groups) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_token_budget_honours_an_agreed_minimum_count():
    lengths = [3, 3, 3, 3, 3, 3]
    assert len(token_budget_micro_batches(lengths, 100)) == 1
    groups = token_budget_micro_batches(lengths, 100, min_micro_batches=4)
    assert len(groups) == 4
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_token_budget_balances_the_micro_batches():
    lengths = [4] * 10
    groups = token_budget_micro_batches(lengths, 28)  # 7 rows fit, 2 micro-batches needed
    assert sorted(len(g) for g in groups) == [5, 5]


def test_a_row_longer_than_the_budget_names_the_key():
    with pytest.raises(RecipeError) as info:
        token_budget_micro_batches([5, 40, 3], 32)
    assert str(info.value) == (
        "actor.ppo_max_token_len_per_gpu: a sequence of 40 tokens does not fit the micro-batch "
        "token budget of 32; set it to at least the prompt plus response length (40)"
    )


def test_padding_trim_cuts_columns_no_row_uses():
    mask = torch.tensor(
        [
            [0, 0, 0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
        ]
    )
    trim = padding_trim(mask, response_width=4)  # prompt columns 0..3, responses 4..7
    assert (trim.start, trim.end, trim.response_len) == (2, 6, 2)


def test_padding_trim_keeps_the_position_that_predicts_the_first_response_token():
    mask = torch.tensor([[1, 1, 0, 0, 0, 0]])  # prompt right-padded, empty response
    trim = padding_trim(mask, response_width=3)
    assert trim.start == 0 and trim.end == 4 and trim.response_len == 1
