import numpy as np
import pytest
import torch

from plugrl.algorithms.dynamic_sampling import (
    DynamicSampler,
    filter_groups,
    group_metric_values,
)
from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError


def round_batch(uids, acc):
    rows = len(uids)
    scores = torch.zeros(rows, 2)
    scores[:, -1] = torch.tensor(acc, dtype=torch.float32)
    return Batch(
        {
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.5,
            "row": torch.arange(rows),
        },
        {"uid": uids, "acc": list(acc)},
    )


def test_filter_drops_groups_whose_metric_is_constant():
    # a: all correct (dropped), b: mixed (kept), c: a group of one (kept), d: all wrong (dropped)
    batch = round_batch(["a", "a", "b", "b", "c", "d", "d"], [1, 1, 0, 1, 1, 0, 0])
    kept, metrics = filter_groups(batch, batch["acc"])
    assert kept["uid"].tolist() == ["b", "b", "c"]
    assert kept["row"].tolist() == [2, 3, 4]
    assert metrics == {"filter_groups/kept_groups": 2.0, "filter_groups/dropped_groups": 2.0}


def test_filter_can_keep_nothing():
    batch = round_batch(["a", "a"], [1, 1])
    kept, metrics = filter_groups(batch, batch["acc"])
    assert len(kept) == 0 and metrics["filter_groups/kept_groups"] == 0


def test_filter_checks_the_metric_length():
    batch = round_batch(["a", "a"], [1, 0])
    with pytest.raises(ValueError, match="got 3 metric values for a batch of 2 rows"):
        filter_groups(batch, [1, 0, 1])


def test_metric_values_from_columns_and_reward_sums():
    batch = round_batch(["a", "a"], [1, 0])
    assert group_metric_values(batch, "acc").tolist() == [1.0, 0.0]
    assert group_metric_values(batch, "score").tolist() == [1.0, 0.0]
    assert group_metric_values(batch, "seq_reward").tolist() == [1.0, 0.0]
    assert group_metric_values(batch, "seq_final_reward").tolist() == [0.0, -1.0]


def test_unknown_metric_names_the_key_and_the_columns():
    batch = round_batch(["a"], [1])
    with pytest.raises(RecipeError, match=r"algorithm.filter_groups.metric: 'pass' is neither"):
        group_metric_values(batch, "pass")


def test_metric_column_must_hold_one_number_per_response():
    batch = round_batch(["a", "a"], [1, 0])
    batch["pred"] = ["x", "y"]
    with pytest.raises(RecipeError, match=r"column 'pred' does not hold numbers"):
        group_metric_values(batch, "pred")
    with pytest.raises(RecipeError, match=r"column 'token_level_scores' has shape \(2, 2\)"):
        group_metric_values(batch, "token_level_scores")


def test_sampler_collects_rounds_until_enough_groups_and_drops_the_surplus():
    sampler = DynamicSampler(target_groups=3, max_num_gen_batches=0)
    sampler.add(round_batch(["a", "a", "b", "b"], [1, 1, 0, 1]))  # keeps b
    assert not sampler.ready and sampler.num_groups == 1
    sampler.add(round_batch(["c", "c", "d", "d", "e", "e"], [0, 1, 1, 0, 1, 0]))  # keeps c d e
    assert sampler.ready
    batch, metrics = sampler.take()
    assert batch["uid"].tolist() == ["b", "b", "c", "c", "d", "d"]
    assert metrics == {
        "train/num_gen_batches": 2.0,
        "filter_groups/kept_groups": 4.0,
        "filter_groups/dropped_groups": 1.0,
        "filter_groups/surplus_groups": 1.0,
    }
    # the next step starts from scratch
    assert sampler.num_groups == 0 and sampler.num_gen_batches == 0 and not sampler.ready


def test_sampler_gives_up_after_max_num_gen_batches():
    sampler = DynamicSampler(target_groups=2, max_num_gen_batches=2)
    sampler.add(round_batch(["a", "a"], [1, 1]))
    with pytest.raises(DataError, match=r"kept 0 of the 2 prompt groups a step needs after 2 "):
        sampler.add(round_batch(["b", "b"], [0, 0]))


def test_sampler_that_reaches_the_target_on_the_last_round_does_not_fail():
    sampler = DynamicSampler(target_groups=1, max_num_gen_batches=2)
    sampler.add(round_batch(["a", "a"], [1, 1]))
    sampler.add(round_batch(["b", "b"], [0, 1]))
    assert sampler.ready


def test_unlimited_sampler_keeps_going():
    sampler = DynamicSampler(target_groups=1, max_num_gen_batches=0)
    for _ in range(20):
        sampler.add(round_batch(["a", "a"], [1, 1]))
    assert not sampler.ready and sampler.num_gen_batches == 20


def test_take_before_ready_is_an_error():
    sampler = DynamicSampler(target_groups=2)
    with pytest.raises(RuntimeError, match="only 0 of 2 groups collected"):
        sampler.take()


def test_sampler_from_recipe(recipe_from):
    recipe = recipe_from(
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=5",
    )
    sampler = DynamicSampler.from_recipe(recipe)
    assert (sampler.target_groups, sampler.max_num_gen_batches, sampler.metric) == (8, 5, "score")


def test_explicit_metric_values_override_the_column():
    sampler = DynamicSampler(target_groups=1)
    sampler.add(round_batch(["a", "a"], [1, 1]), metric_values=np.array([0.2, 0.7]))
    assert sampler.ready


# ------------------------------------------- rounds whose prompts and responses differ in width

PAD = 0


def rollout_round(prompts, responses, uids, *, pad=PAD):
    """What a generation round hands the sampler: a batch from build_rollout_batch (two
    responses per prompt), scored on each response's last token, with an ``acc`` column."""
    from plugrl.data.batch import left_pad
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.parts.rollout import Completion

    ids, mask = left_pad(prompts, pad)
    prompt_batch = Batch(
        {"prompts": ids, "prompt_attention_mask": mask},
        {"uid": uids, "raw_prompt_ids": prompts},
        meta={"epoch": 0},
    )
    completions = [
        Completion(
            token_ids=list(tokens),
            log_probs=[-0.25 * (i + 1) for i in range(len(tokens))],
            finish_reason="stop",
            prompt_index=row // 2,
        )
        for row, tokens in enumerate(responses)
    ]
    batch = build_rollout_batch(prompt_batch, completions, n=2, pad_token_id=pad)
    acc = [float(len(tokens) % 2) for tokens in responses]
    scores = torch.zeros(batch["responses"].shape)
    for row, tokens in enumerate(responses):
        scores[row, max(len(tokens) - 1, 0)] = acc[row]
    batch["token_level_scores"] = scores
    batch["acc"] = acc
    return batch


def test_rounds_of_different_widths_concatenate_as_one_batch_would_be():
    sampler = DynamicSampler(target_groups=2, metric="acc")
    # round 1: prompts 2 tokens wide, responses 2; group "b" scores the same twice (dropped)
    first = rollout_round([[1, 2], [3]], [[5], [6, 7], [8, 8], [9, 9]], ["a", "b"])
    # round 2: prompts 4 tokens wide, responses 3
    second = rollout_round([[4, 5, 6, 7]], [[9, 9, 9], [10, 11]], ["c"])
    sampler.add(first)
    sampler.add(second)
    batch, _ = sampler.take()

    whole = rollout_round([[1, 2], [4, 5, 6, 7]], [[5], [6, 7], [9, 9, 9], [10, 11]], ["a", "c"])
    assert sorted(batch.keys()) == sorted(whole.keys())
    for name in whole.tensors:
        assert batch[name].dtype == whole[name].dtype, name
        assert batch[name].tolist() == whole[name].tolist(), name
    for name in whole.columns:
        assert list(batch[name]) == list(whole[name]), name
    assert batch.meta == whole.meta
