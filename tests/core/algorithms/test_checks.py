import logging

import pytest

from plugrl.algorithms.checks import check_algorithm
from plugrl.errors import RecipeError


def fails(recipe, plugins, key, message):
    with pytest.raises(RecipeError, match=message) as info:
        check_algorithm(recipe, plugins)
    assert info.value.key == key
    assert "\n" not in str(info.value)


def test_default_recipe_passes(recipe_from, plugins):
    check_algorithm(recipe_from(), plugins)


def test_gae_without_a_critic_fails_at_start_up(recipe_from, plugins):
    recipe = recipe_from("algorithm.adv_estimator=gae", "critic.enable=false")
    fails(
        recipe,
        plugins,
        "algorithm.adv_estimator",
        "'gae' needs values from a critic but critic.enable is false",
    )


@pytest.mark.parametrize("enable", ["true", "null"])
def test_gae_with_a_critic_or_the_automatic_choice_passes(recipe_from, plugins, enable):
    check_algorithm(recipe_from("algorithm.adv_estimator=gae", f"critic.enable={enable}"), plugins)


def test_an_unused_critic_is_a_warning(recipe_from, plugins, caplog):
    with caplog.at_level(logging.WARNING, logger="plugrl.algorithms"):
        check_algorithm(recipe_from("critic.enable=true"), plugins)
    assert "advantage estimator 'grpo' does not use values" in caplog.text


def test_remax_with_a_scheduler_that_computes_no_baselines_fails(recipe_from, plugins):
    recipe = recipe_from("algorithm.adv_estimator=remax", "scheduler.name=plain")
    fails(
        recipe,
        plugins,
        "algorithm.adv_estimator",
        "'remax' needs batch column reward_baselines, which scheduler 'plain' does not produce",
    )


@pytest.mark.parametrize("scheduler", ["with_baselines", "sync"])
def test_remax_with_a_scheduler_that_declares_baselines_or_nothing(recipe_from, plugins, scheduler):
    recipe = recipe_from("algorithm.adv_estimator=remax", f"scheduler.name={scheduler}")
    check_algorithm(recipe, plugins)


def test_grpo_passk_needs_two_responses_per_prompt(recipe_from, plugins):
    recipe = recipe_from("algorithm.adv_estimator=grpo_passk", "rollout.n=1")
    fails(recipe, plugins, "rollout.n", "'grpo_passk' compares at least 2 responses per prompt")
    check_algorithm(recipe_from("algorithm.adv_estimator=grpo_passk", "rollout.n=2"), plugins)


def test_dual_clip_bound_must_exceed_one(recipe_from, plugins):
    recipe = recipe_from("actor.clip_ratio_c=1.0")
    fails(recipe, plugins, "actor.clip_ratio_c", "the dual-clip bound must be greater than 1")
    # losses without dual clip do not read it
    check_algorithm(recipe_from("actor.clip_ratio_c=1.0", "actor.policy_loss=gspo"), plugins)


def test_unknown_names_fail_when_the_recipe_is_read(recipe_from):
    with pytest.raises(RecipeError, match=r"algorithm.adv_estimator: unknown advantage estimator"):
        recipe_from("algorithm.adv_estimator=grpoo")
    with pytest.raises(RecipeError, match=r"did you mean 'low_var_kl'"):
        recipe_from("actor.kl_loss_type=low_var_k")


def test_group_estimators_with_one_response_per_prompt_warn(recipe_from, plugins, caplog):
    with caplog.at_level(logging.WARNING, logger="plugrl.algorithms"):
        check_algorithm(recipe_from("rollout.n=1"), plugins)
        check_algorithm(recipe_from("rollout.n=4", "algorithm.adv_estimator=rloo"), plugins)
    assert caplog.text.count("compares responses to the same prompt but rollout.n is 1") == 1
