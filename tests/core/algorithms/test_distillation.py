"""The on-policy distillation term (verl's ``distillation_loss``) on hand values, in the actor
objective, and the ``distillation`` section's one-line refusals."""

import math

import pytest
import torch

from plugrl.algorithms.distillation import (
    TEACHER_LOG_PROBS,
    distillation_estimates,
    distillation_term,
    estimate_stats,
)
from plugrl.algorithms.objective import PolicyObjective
from plugrl.data.batch import Batch
from plugrl.errors import DataError, RecipeError
from plugrl.parts.algorithm import LossScale
from plugrl.recipe.distillation import DistillationLossConfig
from plugrl.recipe.teachers import teacher_configs

# valid tokens: student - teacher = d = 0.5, -1.0, 0.0; the fourth is padding
STUDENT = [[-1.0, -2.0], [-0.5, 0.0]]
TEACHER = [[-1.5, -1.0], [-0.5, 7.0]]
MASK = [[1.0, 1.0], [1.0, 0.0]]
K3 = [math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0]
TEACHER_ON = ("distillation.enabled=true", "distillation.teachers.t.model.path=/models/teacher")


def k1(log_prob, ref_log_prob):
    return log_prob - ref_log_prob


def k3(log_prob, ref_log_prob):
    d = (log_prob - ref_log_prob).clamp(-20, 20)
    return (torch.exp(-d) + d - 1).clamp(-10, 10)


def token_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def term(config, penalty, policy_loss=None):
    log_prob = torch.tensor(STUDENT, dtype=torch.float64, requires_grad=True)
    loss, metrics = distillation_term(
        config,
        penalty,
        policy_loss,
        log_prob=log_prob,
        old_log_prob=torch.tensor(STUDENT, dtype=torch.float64),
        teacher_log_prob=torch.tensor(TEACHER, dtype=torch.float64),
        response_mask=torch.tensor(MASK, dtype=torch.float64),
        aggregate=token_mean,
    )
    (gradient,) = torch.autograd.grad(loss, log_prob)
    return float(loss.detach()), gradient, metrics


def test_k3_as_a_loss_is_backpropagated_through_the_student():
    loss, gradient, metrics = term(DistillationLossConfig(loss_mode="k3"), k3)
    assert loss == pytest.approx(sum(K3) / 3)
    # d/ds (exp(-d) + d - 1) = 1 - exp(-d), each token a third of the mean
    expected = [[1 - math.exp(-0.5), 1 - math.e], [0.0, 0.0]]
    assert gradient.flatten().tolist() == pytest.approx([v / 3 for row in expected for v in row])
    assert metrics["actor/distillation/loss"] == pytest.approx(sum(K3) / 3)
    assert metrics["actor/distillation/abs_loss"] == pytest.approx(sum(K3) / 3)


def test_k1_policy_gradient_takes_the_negative_estimate_as_each_tokens_advantage():
    from plugrl.recipe import Recipe
    from plugrl.testing import part_context
    from plugrl_policy_losses.losses import VanillaPPO

    config = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True)
    policy_loss = VanillaPPO(Recipe().actor, part_context())
    loss, gradient, metrics = term(config, k1, policy_loss)
    # ratio 1: loss = -A = d per token, A = -(0.5, -1, 0)
    assert loss == pytest.approx((0.5 - 1.0 + 0.0) / 3)
    # the advantage carries no gradient: d loss / d s = -A / 3 = d / 3
    assert gradient.flatten().tolist() == pytest.approx([0.5 / 3, -1.0 / 3, 0.0, 0.0])
    assert metrics["actor/distillation/abs_loss"] == pytest.approx(1.5 / 3)
    assert metrics["actor/distillation/pg_clipfrac"] == 0.0
    assert "actor/distillation/pg_loss" not in metrics


def test_the_clamps_bound_the_log_probs_and_the_estimates():
    floor = DistillationLossConfig(loss_mode="k1", log_prob_min_clamp=-1.2)
    estimates = distillation_estimates(floor, k1, torch.tensor(STUDENT), torch.tensor(TEACHER))
    # -2.0 and -1.5 rise to -1.2
    assert estimates[0].tolist() == pytest.approx([-1.0 + 1.2, -1.2 + 1.0])
    bound = DistillationLossConfig(loss_mode="k1", loss_max_clamp=0.75)
    estimates = distillation_estimates(bound, k1, torch.tensor(STUDENT), torch.tensor(TEACHER))
    assert estimates[0].tolist() == pytest.approx([0.5, -0.75])


def test_estimate_stats_are_over_the_response_tokens_only():
    stats = estimate_stats(
        DistillationLossConfig(loss_mode="k1"),
        k1,
        torch.tensor(STUDENT),
        torch.tensor(TEACHER),
        torch.tensor(MASK),
    )
    assert stats == {
        "actor/distillation/loss_min": pytest.approx(-1.0),
        "actor/distillation/loss_max": pytest.approx(0.5),
    }


# ------------------------------------------------------------------------ in the objective


def micro_batch(**extra):
    return Batch(
        {
            "old_log_probs": torch.tensor(STUDENT, dtype=torch.float64),
            "advantages": torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
            "response_mask": torch.tensor(MASK),
            TEACHER_LOG_PROBS: torch.tensor(TEACHER),
            **extra,
        }
    )


def run(objective, batch=None):
    log_prob = torch.tensor(STUDENT, dtype=torch.float64, requires_grad=True)
    loss, metrics = objective(
        batch or micro_batch(), log_prob, None, LossScale(num_tokens=3, num_seqs=2)
    )
    (gradient,) = torch.autograd.grad(loss, log_prob)
    return float(loss.detach()), gradient, metrics


def test_the_objective_adds_the_weighted_term_to_the_task_loss(recipe_from, plugins):
    recipe = recipe_from(*TEACHER_ON, "distillation.loss.distillation_loss_coef=0.5")
    loss, _, metrics = run(PolicyObjective.from_recipe(recipe, plugins))
    task = -2.0 / 3  # advantages 1, 1 on row 0 at ratio 1; 0 on row 1
    assert metrics["actor/pg_loss"] == pytest.approx(task)
    assert loss == pytest.approx(task + 0.5 * sum(K3) / 3)


def test_without_task_rewards_only_the_term_trains(recipe_from, plugins):
    recipe = recipe_from(
        *TEACHER_ON,
        "distillation.loss.use_task_rewards=false",
        "distillation.loss.distillation_loss_coef=0.5",  # ignored without task rewards
    )
    objective = PolicyObjective.from_recipe(recipe, plugins)
    loss, gradient, metrics = run(objective)
    assert loss == pytest.approx(sum(K3) / 3)
    assert gradient[0].tolist() == pytest.approx([(1 - math.exp(-0.5)) / 3, (1 - math.e) / 3])
    assert metrics["actor/pg_loss"] == pytest.approx(-2.0 / 3)  # still logged
    # a row of zero task advantages still learns from the teacher
    assert objective.rows_without_gradient(micro_batch()) is None


def test_a_batch_without_teacher_log_probs_is_refused(recipe_from, plugins):
    objective = PolicyObjective.from_recipe(recipe_from(*TEACHER_ON), plugins)
    batch = micro_batch()
    batch.pop(TEACHER_LOG_PROBS)
    with pytest.raises(DataError, match="no teacher_log_probs"):
        run(objective, batch)


# ------------------------------------------------------------------------ the section


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (("distillation.enabled=true",), "distillation.teachers", "no teacher is set"),
        (
            (*TEACHER_ON, "distillation.loss.loss_mode=k1"),
            "distillation.loss.loss_mode",
            "use_policy_gradient=true",
        ),
        (
            (*TEACHER_ON, "distillation.loss.loss_mode=forward_kl_topk"),
            "distillation.loss.loss_mode",
            "top-k log-probs",
        ),
        (
            (*TEACHER_ON, "distillation.teachers.u.model.path=/models/other"),
            "distillation.teachers.t.key",
            "several teachers",
        ),
        (
            (
                "distillation.enabled=true",
                "distillation.teachers.t.model.path=/m/a",
                "distillation.teachers.t.key=gsm8k",
                "distillation.teachers.u.model.path=/m/b",
                "distillation.teachers.u.key=gsm8k",
            ),
            "distillation.teachers.u.key",
            "both take",
        ),
        (
            ("distillation.enabled=true", "distillation.teachers.t.key=a"),
            "distillation.teachers.t.model.path",
            "needs a model folder",
        ),
        (
            (*TEACHER_ON, "distillation.teachers.t.rollout.engine=vllm"),
            "distillation.teachers.t.rollout.engine",
            "chosen by distillation.teachers.t.engine",
        ),
    ],
)
def test_a_section_that_cannot_work_is_refused_in_one_line(recipe_from, overrides, key, words):
    with pytest.raises(RecipeError, match=words) as caught:
        recipe_from(*overrides)
    assert caught.value.key == key
    assert "\n" not in str(caught.value)


def test_teachers_route_by_key_and_their_paths_are_absolute(recipe_from):
    recipe = recipe_from(
        "distillation.enabled=true",
        "distillation.teachers.math.model.path=models/math",
        "distillation.teachers.math.key=gsm8k",
        "distillation.teachers.code.model.path=/models/code",
        "distillation.teachers.code.key=apps",
    )
    teachers = teacher_configs(recipe.distillation)
    assert {name: t.key for name, t in teachers.items()} == {"math": "gsm8k", "code": "apps"}
    assert teachers["math"].model.path.endswith("/models/math")
    assert teachers["math"].model.path.startswith("/")
