"""The ``skyrl_gym`` environment: skyrl-gym's own gsm8k environments played by the ``env``
agent loop, and the one-line errors of a wrong environment id."""

from __future__ import annotations

import asyncio
import sys

import pytest

from plugrl.errors import RecipeError
from plugrl.parts.agent import AgentLoopConfig
from plugrl.recipe import part_args
from plugrl.testing import ScriptedSession, make_tiny_tokenizer, part_context
from plugrl_agent_loops.env import EnvLoop
from plugrl_skyrl_gym.config import SkyrlGymConfig
from plugrl_skyrl_gym.env import SkyrlGymEnvironment

QUESTION = [{"role": "user", "content": "Natalia had 2 clips and sold 3 more. How many?"}]
# a verl-style row: the ground truth under reward_model, as plugrl's data has it
ROW = {"prompt": QUESTION, "reward_model": {"ground_truth": "5"}, "extra_info": {}}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def agent_recipe(plugrl_recipe, **env_args):
    return plugrl_recipe(
        {
            "rollout.agent": {
                "loop": "env",
                "env": "skyrl_gym",
                "env_args": env_args,
                "max_turns": 3,
            }
        }
    )


def play(recipe, tokenizer, replies, row=ROW):
    plugins = part_context(recipe).plugins
    config = part_args(recipe, "rollout", "agent.env_args", plugins)
    context = part_context(recipe)
    session = ScriptedSession(
        tokenizer,
        replies,
        environment=lambda: SkyrlGymEnvironment(config, context),
        config=recipe.rollout.agent,
    )
    return asyncio.run(EnvLoop(AgentLoopConfig(), context).run(row, session))


def test_the_environment_is_registered_with_its_options(plugrl_plugin_manager):
    entry = plugrl_plugin_manager.registry("environments").get("skyrl_gym")
    assert entry.load() is SkyrlGymEnvironment
    assert entry.load_config() is SkyrlGymConfig
    assert entry.requires == ("skyrl_gym",) and entry.install == "pip install skyrl-gym"


def test_without_skyrl_gym_it_is_listed_unavailable_with_its_install_line(
    plugrl_plugin_manager, monkeypatch
):
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # as if not installed
    entry = plugrl_plugin_manager.registry("environments").get("skyrl_gym")
    assert entry.unavailable_reason == "needs skyrl_gym (pip install skyrl-gym)"


def test_a_multi_turn_gsm8k_episode_gets_skyrl_gyms_turn_rewards(plugrl_recipe, tokenizer):
    recipe = agent_recipe(plugrl_recipe, env_id="gsm8k_multi_turn")
    trajectory = play(recipe, tokenizer, ["It is 4. #### 4", "Sorry: #### 5"])
    # skyrl-gym's format score for a wrong answer is 0.2 spread over max_turns (ours: 3)
    assert trajectory.turn_rewards == pytest.approx([0.2 / 3, 1.0])
    assert trajectory.reward == pytest.approx(1.0 + 0.2 / 3)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 2)
    assert trajectory.messages[2]["role"] == "user"
    assert "#### ANSWER" in trajectory.messages[2]["content"]  # skyrl-gym's observation
    assert trajectory.metrics["env/steps"] == 2.0  # the environment's own metrics
    assert trajectory.loss_mask.count(0) > 0


def test_the_rows_env_class_picks_the_environment(plugrl_recipe, tokenizer):
    recipe = agent_recipe(plugrl_recipe)
    row = {**ROW, "env_class": "gsm8k", "reward_spec": {"ground_truth": "5"}}
    trajectory = play(recipe, tokenizer, ["#### 5"], row=row)
    assert (trajectory.turn_rewards, trajectory.finish_reason) == ([1.0], "stop")
    wrong = play(recipe, tokenizer, ["#### 6"], row=row)
    assert (wrong.reward, wrong.num_turns) == (0.0, 1)  # gsm8k is done after one step


def test_extras_from_the_recipe_reach_the_environment(plugrl_recipe, tokenizer):
    recipe = agent_recipe(plugrl_recipe, env_id="gsm8k_multi_turn", extras={"max_turns": 1})
    trajectory = play(recipe, tokenizer, ["#### 4", "#### 5"])
    # done after one turn: the environment was made with max_turns 1
    assert (trajectory.num_turns, trajectory.finish_reason) == (1, "stop")
    assert trajectory.turn_rewards == pytest.approx([0.2])


def test_an_unknown_env_id_is_a_one_line_error_at_start_up_naming_the_registered_ones(
    plugrl_recipe,
):
    # the drill: a wrong id was caught only at the first sample, not when the recipe was built
    with pytest.raises(RecipeError) as info:
        agent_recipe(plugrl_recipe, env_id="gsm9k")
    message = str(info.value)
    assert "rollout.agent.env_args.env_id: skyrl-gym has no environment 'gsm9k'; registered: " in (
        message
    )
    assert "gsm8k, gsm8k_multi_turn" in message and "\n" not in message
    with pytest.raises(RecipeError, match="cannot import 'no_such_module_here'"):
        agent_recipe(plugrl_recipe, env_id="no_such_module_here:gsm8k")


def test_a_module_colon_id_env_id_imports_the_module_that_registers_it(
    plugrl_recipe, tokenizer, tmp_path, monkeypatch
):
    # the drill: the documented 'module:id' form failed on every sample ("No registered env")
    (tmp_path / "my_gsm8k_envs.py").write_text(
        "from skyrl_gym.envs.registration import register\n"
        "register(id='my_gsm8k', entry_point='skyrl_gym.envs.gsm8k.env:GSM8kEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = agent_recipe(plugrl_recipe, env_id="my_gsm8k_envs:my_gsm8k")
    trajectory = play(recipe, tokenizer, ["#### 5"])
    assert (trajectory.finish_reason, trajectory.reward) == ("stop", 1.0)


def test_a_row_without_an_environment_ends_as_error_with_the_reason_logged(
    plugrl_recipe, tokenizer, caplog
):
    trajectory = play(agent_recipe(plugrl_recipe), tokenizer, ["#### 5"])
    assert (trajectory.finish_reason, trajectory.response_ids) == ("error", [])
    assert (
        "rollout.agent.env_args.env_id: no skyrl-gym environment for this row; set env_id, or "
        "give the data an env_class column"
    ) in caplog.text


def test_a_misspelled_option_is_one_line(plugrl_recipe):
    with pytest.raises(RecipeError) as info:
        agent_recipe(plugrl_recipe, env_idd="gsm8k")
    assert str(info.value) == (
        "rollout.agent.env_args.env_idd: unknown key; did you mean 'rollout.agent.env_args.env_id'?"
    )
