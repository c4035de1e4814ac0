import math

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.errors import DataError
from plugrl.parts.algorithm import AlgorithmConfig
from plugrl.plugin.build import build_estimator
from plugrl.recipe import part_args
from plugrl.testing import part_context
from plugrl_estimators import estimators as E
from plugrl_estimators.options import GAEArgs

EPS = 1e-6
R = 3


def build(cls, config, options=None):
    return cls(config, part_context(options=options))


def assert_close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def outcome_batch(scores, lengths, uids, **tensors):
    """One score per response on its last valid token; empty responses get no reward."""
    rewards = torch.zeros(len(scores), R)
    mask = torch.zeros(len(scores), R, dtype=torch.long)
    for row, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[row, :length] = 1
        if length:
            rewards[row, length - 1] = score
    return Batch({"token_level_rewards": rewards, "response_mask": mask, **tensors}, {"uid": uids})


def per_row(advantages, batch):
    """The value each row carries on its valid tokens (checks it is the same on all of them
    and 0 elsewhere)."""
    mask = batch["response_mask"].bool()
    assert torch.all(advantages[~mask] == 0)
    values = []
    for row in range(len(batch)):
        valid = advantages[row][mask[row]]
        if len(valid) == 0:
            values.append(0.0)
            continue
        assert torch.allclose(valid, valid[0].expand_as(valid))
        values.append(float(valid[0]))
    return values


# group a: 4 responses (the second one empty), b: all equal, c: a group of one
SCORES = [1.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
LENGTHS = [2, 0, 1, 3, 3, 2, 2]
UIDS = ["a", "a", "a", "a", "b", "b", "c"]


def test_grpo_normalises_by_the_unbiased_group_std():
    batch = outcome_batch(SCORES, LENGTHS, UIDS)
    advantages, returns = build(E.GRPO, AlgorithmConfig()).compute(batch)
    # a: mean 0.75, unbiased std sqrt(0.75 / 3) = 0.5; b: std 0; c: mean 0, std 1
    a = [(s - 0.75) / (0.5 + EPS) for s in (1.0, 0.0, 1.0, 1.0)]
    expected = [a[0], 0.0, a[2], a[3], 0.0, 0.0, 3.0 / (1 + EPS)]
    assert per_row(advantages, batch) == pytest.approx(expected)
    assert torch.equal(advantages, returns)


def test_dr_grpo_does_not_divide_by_std():
    batch = outcome_batch(SCORES, LENGTHS, UIDS)
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=False)
    advantages, _ = build(E.GRPO, config).compute(batch)
    assert per_row(advantages, batch) == pytest.approx([0.25, 0.0, 0.25, 0.25, 0.0, 0.0, 3.0])


def test_grpo_groups_by_uid_not_by_position():
    shuffled = [0, 4, 6, 1, 5, 2, 3]
    batch = outcome_batch(
        [SCORES[i] for i in shuffled], [LENGTHS[i] for i in shuffled], [UIDS[i] for i in shuffled]
    )
    advantages, _ = build(E.GRPO, AlgorithmConfig(norm_adv_by_std_in_grpo=False)).compute(batch)
    expected = [0.25, 0.0, 0.25, 0.25, 0.0, 0.0, 3.0]
    assert per_row(advantages, batch) == pytest.approx([expected[i] for i in shuffled])


def test_rloo_subtracts_the_mean_of_the_others():
    batch = outcome_batch(SCORES, LENGTHS, UIDS)
    advantages, _ = build(E.RLOO, AlgorithmConfig()).compute(batch)
    # a: 1 - (0 + 1 + 1)/3 = 1/3, the empty one 0 - 1; b: 0; a group of one keeps its score
    assert per_row(advantages, batch) == pytest.approx([1 / 3, 0.0, 1 / 3, 1 / 3, 0, 0, 3.0])


def test_opo_uses_a_length_weighted_baseline():
    batch = outcome_batch([1.0, 0.0, 3.0, 5.0], [2, 1, 3, 1], ["a", "a", "a", "c"])
    advantages, _ = build(E.OPO, AlgorithmConfig()).compute(batch)
    baseline = (2 * 1 + 1 * 0 + 3 * 3) / 6
    expected = [1 - baseline, 0 - baseline, 3 - baseline, 5.0]
    assert per_row(advantages, batch) == pytest.approx(expected)


def test_opo_group_of_only_empty_responses_is_finite():
    batch = outcome_batch([1.0, 2.0], [0, 0], ["a", "a"])
    advantages, _ = build(E.OPO, AlgorithmConfig()).compute(batch)
    assert torch.all(advantages == 0)


def test_gpg_scales_by_batch_over_nonzero_scores():
    batch = outcome_batch(SCORES, LENGTHS, UIDS)
    advantages, _ = build(E.GPG, AlgorithmConfig()).compute(batch)
    alpha = 7 / 6  # 7 responses, 6 non-zero scores
    expected = [alpha * x for x in (0.25, 0.0, 0.25, 0.25, 0.0, 0.0, 3.0)]
    assert per_row(advantages, batch) == pytest.approx(expected)


def test_grpo_passk_rewards_only_the_best_by_its_margin():
    batch = outcome_batch([1.0, 0.0, 3.0, 2.0, 2.0, 2.0], [1, 2, 3, 1, 2, 1], list("aaaabb"))
    advantages, _ = build(E.GRPOPassK, AlgorithmConfig()).compute(batch)
    # a: best 3, second 2; mean 1.5, unbiased variance (0.25 + 2.25 + 2.25 + 0.25) / 3
    std = math.sqrt(5 / 3)
    assert per_row(advantages, batch) == pytest.approx([0, 0, 1 / (std + EPS), 0, 0, 0])
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=False)
    advantages, _ = build(E.GRPOPassK, config).compute(batch)
    assert per_row(advantages, batch) == pytest.approx([0, 0, 1.0, 0, 0, 0])


def test_grpo_passk_needs_two_responses_per_group():
    batch = outcome_batch([1.0, 0.0, 1.0], [1, 1, 1], ["a", "a", "b"])
    with pytest.raises(DataError, match="grpo_passk needs at least 2 responses per prompt"):
        build(E.GRPOPassK, AlgorithmConfig()).compute(batch)


def test_reinforce_plus_plus_baseline_whitens_centred_scores_over_tokens():
    batch = outcome_batch([1.0, 0.0, 3.0], [1, 2, 1], ["a", "a", "b"])
    advantages, _ = build(E.ReinforcePlusPlusBaseline, AlgorithmConfig()).compute(batch)
    # centred: 0.5 (1 token), -0.5 (2 tokens), 3 (single group: mean 0)
    tokens = [0.5, -0.5, -0.5, 3.0]
    mean = sum(tokens) / 4
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 3 + 1e-8)
    expected = [(0.5 - mean) / std, (-0.5 - mean) / std, (3.0 - mean) / std]
    assert per_row(advantages, batch) == pytest.approx(expected)


def test_reinforce_plus_plus_discounts_and_whitens():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = Batch({"token_level_rewards": rewards, "response_mask": mask})
    advantages, returns = build(E.ReinforcePlusPlus, AlgorithmConfig(gamma=0.5)).compute(batch)
    # row 0: 2, 0 + 0.5*2 = 1, 1 + 0.5*1 = 1.5; row 1 (padding ignored): 4, 0 + 0.5*4 = 2
    assert_close(returns, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]])
    tokens = [1.5, 1.0, 2.0, 2.0, 4.0]
    mean = sum(tokens) / 5
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 4 + 1e-8)
    expected = [[(1.5 - mean) / std, (1 - mean) / std, (2 - mean) / std]]
    expected.append([(2 - mean) / std, (4 - mean) / std, 0.0])
    assert_close(advantages, expected)


def test_reinforce_plus_plus_carries_returns_over_masked_tokens():
    # a tool observation in the middle of a response: not trained on, reward passes through
    batch = Batch(
        {
            "token_level_rewards": torch.tensor([[1.0, 9.0, 2.0]]),
            "response_mask": torch.tensor([[1, 0, 1]]),
        }
    )
    _, returns = build(E.ReinforcePlusPlus, AlgorithmConfig(gamma=0.5)).compute(batch)
    assert returns.tolist() == [[2.0, 0.0, 2.0]]


def test_remax_subtracts_the_greedy_baseline():
    batch = Batch(
        {
            "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "reward_baselines": torch.tensor([0.5, 1.0]),
        }
    )
    advantages, returns = build(E.ReMax, AlgorithmConfig()).compute(batch)
    assert returns.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]
    assert advantages.tolist() == [[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]]


GAE_BATCH = {
    "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]),
    "values": torch.tensor([[0.5, 0.4, 0.2], [1.0, 1.0, 9.0]]),
    "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
}
# gamma 0.9, lam 0.5. Row 0: delta2 = 1 - 0.2 = 0.8; delta1 = 0.9*0.2 - 0.4 = -0.22,
# A1 = -0.22 + 0.45*0.8 = 0.14; delta0 = 0.9*0.4 - 0.5 = -0.14, A0 = -0.14 + 0.45*0.14 = -0.077.
# Row 1 (last token is padding): A1 = 2 - 1 = 1; delta0 = 0.9*1 - 1 = -0.1, A0 = -0.1 + 0.45.
GAE_ADVANTAGES = [[-0.077, 0.14, 0.8], [0.35, 1.0, 0.0]]
GAE_RETURNS = [[0.423, 0.54, 1.0], [1.35, 2.0, 0.0]]


def test_gae_without_whitening():
    config = AlgorithmConfig(gamma=0.9, lam=0.5)
    advantages, returns = build(E.GAE, config, GAEArgs(whiten=False)).compute(Batch(GAE_BATCH))
    assert_close(advantages, GAE_ADVANTAGES)
    assert_close(returns, GAE_RETURNS)


def test_gae_whitens_by_default():
    config = AlgorithmConfig(gamma=0.9, lam=0.5)
    advantages, returns = build(E.GAE, config).compute(Batch(GAE_BATCH))
    tokens = [-0.077, 0.14, 0.8, 0.35, 1.0]
    mean = sum(tokens) / 5
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 4 + 1e-8)
    expected = [[(t - mean) / std for t in tokens[:3]], [(t - mean) / std for t in tokens[3:]]]
    expected[1].append(0.0)
    assert_close(advantages, expected)
    assert_close(returns, GAE_RETURNS)


def test_gae_reads_its_options_from_the_recipe(recipe_from, plugins):
    recipe = recipe_from("algorithm.adv_estimator=gae", "algorithm.adv_estimator_args.whiten=false")
    assert part_args(recipe, "algorithm", "adv_estimator_args", plugins) == GAEArgs(whiten=False)


def test_gae_without_values_names_the_missing_column():
    batch = Batch({k: v for k, v in GAE_BATCH.items() if k != "values"})
    with pytest.raises(KeyError, match="advantage estimator 'gae' needs batch columns values"):
        build(E.GAE, AlgorithmConfig()).compute(batch)


OUTCOME_ESTIMATORS = [
    E.GRPO,
    E.RLOO,
    E.OPO,
    E.GPG,
    E.GRPOPassK,
    E.ReinforcePlusPlusBaseline,
]


@pytest.mark.parametrize("estimator", OUTCOME_ESTIMATORS, ids=lambda cls: cls.name)
def test_all_equal_groups_get_zero_advantage(estimator):
    batch = outcome_batch([2.0, 2.0, 2.0, 0.0, 0.0], [1, 2, 3, 2, 1], list("aaabb"))
    advantages, _ = build(estimator, AlgorithmConfig()).compute(batch)
    assert torch.all(advantages == 0)


ALL_ESTIMATORS = [*OUTCOME_ESTIMATORS, E.ReinforcePlusPlus, E.ReMax, E.GAE]


@pytest.mark.parametrize("estimator", ALL_ESTIMATORS, ids=lambda cls: cls.name)
def test_empty_responses_get_zero_advantage_and_nothing_is_nan(estimator):
    batch = outcome_batch(
        [1.0, 0.0, 0.0, 1.0],
        [2, 0, 0, 3],
        ["a", "a", "b", "b"],
        values=torch.tensor([[0.1, 0.2, 0.3]] * 4),
        reward_baselines=torch.tensor([0.5, 0.5, 0.5, 0.5]),
    )
    advantages, returns = build(estimator, AlgorithmConfig()).compute(batch)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert torch.all(advantages[1:3] == 0) and torch.all(returns[1:3] == 0)


@pytest.mark.parametrize("estimator", ALL_ESTIMATORS, ids=lambda cls: cls.name)
def test_a_batch_of_only_empty_responses(estimator):
    batch = outcome_batch(
        [0.0, 0.0],
        [0, 0],
        ["a", "a"],
        values=torch.zeros(2, R),
        reward_baselines=torch.zeros(2),
    )
    advantages, returns = build(estimator, AlgorithmConfig()).compute(batch)
    assert torch.all(advantages == 0) and torch.all(returns == 0)


def test_unhashable_uid_is_a_data_error():
    batch = outcome_batch([1.0, 0.0], [1, 1], [["a"], ["a"]])
    with pytest.raises(DataError, match=r"uid of row 0 is \['a'\], which cannot identify a group"):
        build(E.GRPO, AlgorithmConfig()).compute(batch)


def test_build_estimator_from_the_recipe(recipe_from, plugins):
    recipe = recipe_from(
        "algorithm.adv_estimator=gae",
        "algorithm.adv_estimator_args.whiten=false",
        "algorithm.gamma=0.9",
        "algorithm.lam=0.5",
    )
    estimator = build_estimator(recipe, plugins)
    assert isinstance(estimator, E.GAE) and estimator.args == GAEArgs(whiten=False)
    advantages, _ = estimator.compute(Batch(GAE_BATCH))
    assert_close(advantages, GAE_ADVANTAGES)
