"""Start-up checks of the algorithm choices that a recipe's types alone cannot catch.

The run composition calls :func:`check_algorithm` once before anything is built, so that a
combination that would fail mid-run (GAE without a critic, ReMax with a scheduler that does
not compute baselines) stops the run at once with the key to change. These need the chosen
parts' classes; what the recipe alone tells is checked when it is read
(:mod:`plugrl.recipe.checks`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plugrl.errors import RecipeError
from plugrl.plugin.manager import PluginManager

if TYPE_CHECKING:
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.algorithms")

ESTIMATOR_KEY = "algorithm.adv_estimator"

ALWAYS_PRESENT = frozenset(
    {
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "uid",
        "token_level_scores",
        "token_level_rewards",
        "old_log_probs",
    }
)
"""Columns every run's batch has by the time advantages are computed."""

SUM_PI_SQUARED = "sum_pi_squared"
"""The column the actor's old_log_prob pass adds for an estimator that reads it, from a
backend that declares ``TrainingBackend.computes_sum_pi_squared``."""


def check_algorithm(recipe: Recipe, plugins: PluginManager) -> None:
    """Raise a :class:`RecipeError` naming the key to change when the chosen estimator, loss
    and KL settings cannot work together with the rest of the recipe."""
    _check_estimator(recipe, plugins)
    _check_policy_loss(recipe, plugins)


def _check_estimator(recipe: Recipe, plugins: PluginManager) -> None:
    name = recipe.algorithm.adv_estimator
    estimator = plugins.registry("advantage_estimators").load(name)
    requires = set(getattr(estimator, "requires", ()))
    critic = recipe.critic.enable
    if "values" in requires and critic is False:
        raise RecipeError(
            f"{name!r} needs values from a critic but critic.enable is false; set "
            "critic.enable=true (or leave it unset) or choose an estimator without a critic "
            "such as grpo",
            key=ESTIMATOR_KEY,
        )
    if "values" not in requires and critic:
        logger.warning(
            "critic.enable is true but advantage estimator %r does not use values; "
            "the critic is trained for nothing",
            name,
        )
    if SUM_PI_SQUARED in requires:
        backend = plugins.registry("training_backends").load(recipe.actor.backend)
        if not getattr(backend, "computes_sum_pi_squared", False):
            raise RecipeError(
                f"{name!r} reads each token's sum of squared probabilities from the actor's "
                f"log-prob pass, which training backend {recipe.actor.backend!r} does not "
                "compute; choose actor.backend=fsdp2 or megatron, or another estimator",
                key=ESTIMATOR_KEY,
            )
    scheduler_name = recipe.scheduler.name
    scheduler = plugins.registry("schedulers").load(scheduler_name)
    provides = getattr(scheduler, "provides", None)
    if provides is not None:
        # the actor's old_log_prob pass adds sum_pi_squared when the estimator reads it
        missing = sorted(requires - ALWAYS_PRESENT - {SUM_PI_SQUARED} - set(provides))
        if missing:
            raise RecipeError(
                f"{name!r} needs batch column {', '.join(missing)}, which scheduler "
                f"{scheduler_name!r} does not produce; choose another estimator or scheduler",
                key=ESTIMATOR_KEY,
            )
    min_group = int(getattr(estimator, "min_group_size", 1))
    if recipe.rollout.n < min_group:
        raise RecipeError(
            f"{name!r} compares at least {min_group} responses per prompt, got "
            f"{recipe.rollout.n}; set rollout.n >= {min_group}",
            key="rollout.n",
        )
    if "uid" in requires and recipe.rollout.n == 1:
        logger.warning(
            "advantage estimator %r compares responses to the same prompt but rollout.n is 1: "
            "every group has one response and no baseline",
            name,
        )


def _check_policy_loss(recipe: Recipe, plugins: PluginManager) -> None:
    actor = recipe.actor
    loss = plugins.registry("policy_losses").load(actor.policy_loss)
    if getattr(loss, "uses_dual_clip", False) and not actor.clip_ratio_c > 1:
        raise RecipeError(
            f"the dual-clip bound must be greater than 1, got {actor.clip_ratio_c}",
            key="actor.clip_ratio_c",
        )
