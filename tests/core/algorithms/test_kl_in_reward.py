"""KL in the reward: the fixed and adaptive controllers and the penalised rewards."""

import pytest
import torch

from plugrl.algorithms.kl_in_reward import (
    AdaptiveKLController,
    FixedKLController,
    KLInReward,
    apply_kl_in_reward,
    make_kl_controller,
)
from plugrl.data.batch import Batch
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import KLControlConfig
from plugrl_kl_penalties import penalties as K


def test_fixed_controller_keeps_its_value():
    controller = make_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    controller.update(current_kl=3.0, n_steps=100)
    assert controller.value == 0.05


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        (0.3, 0.1 * (1 + 0.2 * 10 / 100)),  # error 0.5, clipped to 0.2
        (0.1, 0.1 * (1 - 0.2 * 10 / 100)),  # error -0.5, clipped to -0.2
        (0.22, 0.1 * (1 + 0.1 * 10 / 100)),  # error 0.1
    ],
)
def test_adaptive_controller_moves_towards_the_target(current_kl, expected):
    config = KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.2, horizon=100)
    controller = make_kl_controller(config)
    controller.update(current_kl=current_kl, n_steps=10)
    assert controller.value == pytest.approx(expected)


def test_adaptive_controller_needs_a_positive_target():
    config = KLControlConfig(type="adaptive", target_kl=0.0)
    with pytest.raises(RecipeError, match=r"algorithm.kl_ctrl.target_kl: the adaptive KL"):
        make_kl_controller(config)


def test_controller_state_round_trip():
    config = KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.2, horizon=100)
    controller = make_kl_controller(config)
    controller.update(current_kl=0.3, n_steps=10)
    restored = make_kl_controller(config)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value != 0.1


def kl_batch():
    return Batch(
        {
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, 0.0]]),
            "ref_log_prob": torch.tensor([[-1.5, -1.0], [-1.0, 5.0]]),
        }
    )


def test_kl_in_reward_penalises_scores_and_reports_the_batch_kl():
    batch = kl_batch()
    controller = FixedKLController(0.1)
    metrics = apply_kl_in_reward(batch, controller, K.kl_k1)
    # k1 = [[0.5, 0], [-1, (padding)]]; rewards = scores - 0.1 * k1
    assert batch["token_level_rewards"].tolist() == [
        pytest.approx([-0.05, 1.0]),
        pytest.approx([0.6, 0.0]),
    ]
    # mean over responses of each response's token mean: (0.25 + -1) / 2
    assert metrics == {
        "actor/reward_kl_penalty": pytest.approx(-0.375),
        "actor/reward_kl_penalty_coeff": 0.1,
    }


def test_kl_in_reward_updates_an_adaptive_controller_with_the_batch_size():
    controller = AdaptiveKLController(0.1, target_kl=0.2, horizon=100)
    metrics = apply_kl_in_reward(kl_batch(), controller, K.kl_abs)
    # |d| = [[0.5, 0], [1, -]]: batch KL (0.25 + 1) / 2 = 0.625 > target, error clipped to 0.2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.625)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 2 / 100))


def test_kl_in_reward_names_missing_columns():
    batch = kl_batch()
    batch.pop("ref_log_prob")
    with pytest.raises(KeyError, match=r"KL in reward \(algorithm.use_kl_in_reward\) needs"):
        apply_kl_in_reward(batch, FixedKLController(0.1), K.kl_k1)


def test_kl_in_reward_from_the_recipe_keeps_its_controller(recipe_from, plugins):
    recipe = recipe_from(
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_penalty=abs",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.1",
        "algorithm.kl_ctrl.target_kl=0.2",
        "algorithm.kl_ctrl.horizon=100",
    )
    kl_in_reward = KLInReward.from_recipe(recipe, plugins)
    first = kl_in_reward(kl_batch())
    second = kl_in_reward(kl_batch())
    assert first["actor/reward_kl_penalty_coeff"] == 0.1
    assert second["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1 * 1.004)
    resumed = KLInReward.from_recipe(recipe, plugins)
    resumed.load_state_dict(kl_in_reward.state_dict())
    assert resumed.controller.value == pytest.approx(0.1 * 1.004**2)
