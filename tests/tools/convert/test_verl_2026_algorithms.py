"""verl scripts that choose the algorithms verl added in 2026 (optimal token baseline, GDPO,
DPPO, IcePop, token-sum aggregation) convert with every key mapped and validate."""

from plugrl.plugin.manager import get_plugin_manager
from plugrl_tools.convert.output import validate
from plugrl_tools.convert.verl import convert_script


def convert(*overrides):
    text = "python3 -m verl.trainer.main_ppo \\\n" + " \\\n".join(f"    {o}" for o in overrides)
    return convert_script(text + "\n", "run.sh", plugins=get_plugin_manager())


def test_an_optimal_token_baseline_script_with_dppo_and_icepop(plugrl_plugin_manager):
    conversion = convert(
        "algorithm.adv_estimator=optimal_token_baseline",
        "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
        "actor_rollout_ref.actor.clip_ratio_c=20.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-sum",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=0.5_5.0",
        "actor_rollout_ref.rollout.n=4",
    )
    assert conversion.recipe["algorithm"] == {
        "adv_estimator": "optimal_token_baseline",
        "rollout_is": "token",
        "rollout_is_threshold": "0.5_5.0",
    }
    assert conversion.recipe["actor"] == {
        "policy_loss": "dppo_kl",
        "clip_ratio_c": 20.0,
        "loss_agg_mode": "token-sum",
    }
    # the one key without a plugrl counterpart is dropped with the reason
    assert [(item.category, item.override.split("=")[0]) for item in conversion.unmapped] == [
        ("dropped", "actor_rollout_ref.actor.calculate_sum_pi_squared")
    ]
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None


def test_a_gdpo_script(plugrl_plugin_manager):
    conversion = convert(
        "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys='[accuracy_reward,format_reward]'",
        "algorithm.gdpo_reward_weights='[1.0,0.5]'",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv",
    )
    assert conversion.recipe["algorithm"] == {
        "adv_estimator": "gdpo",
        "adv_estimator_args": {
            "gdpo_reward_keys": ["accuracy_reward", "format_reward"],
            "gdpo_reward_weights": [1.0, 0.5],
        },
    }
    assert conversion.unmapped == []
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None
