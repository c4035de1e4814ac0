import pytest
import torch

from plugrl.errors import RecipeError
from plugrl_fsdp2.batching import left_align, packed_micro_batches, token_budget_micro_batches


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


def test_token_budget_picks_the_split_with_the_fewest_padded_tokens():
    lengths = [10, 6, 6, 6, 1, 1, 1, 1, 1]
    groups = token_budget_micro_batches(lengths, 24)
    # filling each micro-batch greedily gives [10, 6] [6, 6, 1, 1] [1, 1, 1]: 47 tokens;
    # three micro-batches can do with 10 + 18 + 5
    assert groups == [[0], [1, 2, 3], [4, 5, 6, 7, 8]]


def test_a_row_longer_than_the_budget_names_the_key():
    with pytest.raises(RecipeError) as info:
        token_budget_micro_batches([5, 40, 3], 32)
    assert str(info.value) == (
        "actor.ppo_max_token_len_per_gpu: a sequence of 40 tokens does not fit the micro-batch "
        "token budget of 32; set it to at least the prompt plus response length (40)"
    )


@pytest.mark.parametrize("cut", [token_budget_micro_batches, packed_micro_batches])
def test_a_row_longer_than_a_sequence_parallel_budget_names_each_ranks_share(cut):
    with pytest.raises(RecipeError) as info:
        cut([5, 41, 3], 32, ranks=2)
    assert str(info.value) == (
        "actor.ppo_max_token_len_per_gpu: a sequence of 41 tokens does not fit the micro-batch "
        "token budget of 32 (16 on each of the 2 ranks it is split over); set it to at least "
        "21, a rank's share of the sequence"
    )


def test_left_align_moves_each_row_to_the_left_edge():
    mask = torch.tensor(
        [
            [0, 0, 0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
        ]
    )
    layout = left_align(mask, response_width=4)  # prompt columns 0..3, responses 4..7
    assert layout.columns.tolist() == [[3, 4, 5], [2, 3, 4]]
    assert layout.attention_mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    # outputs of the last 3 positions are kept; row 0's response tokens are predicted by its
    # positions 0 and 1, row 1's first one by its position 1 (its second does not exist)
    assert layout.keep == 3
    assert layout.response_index.tolist() == [[0, 1], [1, 2]]
    assert layout.response_len == 2


def test_left_align_pads_shorter_rows_on_the_right():
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 0],
            [0, 0, 1, 1, 0, 0],
        ]
    )
    layout = left_align(mask, response_width=3)
    assert layout.columns.tolist() == [[0, 1, 2, 3, 4], [2, 3, 4, 5, 5]]
    assert layout.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert layout.keep == 5  # from row 1's last prompt position (new column 0) on
    assert layout.response_index.tolist() == [[2, 3], [0, 1]]


def test_left_align_keeps_the_position_that_predicts_the_first_response_token():
    mask = torch.tensor([[1, 1, 0, 0, 0, 0]])  # prompt right-padded, empty response
    layout = left_align(mask, response_width=3)
    assert layout.columns.tolist() == [[0, 1, 2, 3]]
    assert layout.attention_mask.tolist() == [[1, 1, 0, 0]]
    assert layout.keep == 2 and layout.response_len == 1
