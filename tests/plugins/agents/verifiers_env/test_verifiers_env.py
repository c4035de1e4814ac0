"""The ``verifiers`` environment: small verifiers environments defined here (no datasets from
a hub, no network), played by the ``env`` agent loop and scored by their rubrics."""

from __future__ import annotations

import asyncio
import sys

import pytest
import verifiers as vf
from datasets import Dataset

from plugrl.errors import RecipeError
from plugrl.parts.agent import AgentConfig, AgentLoopConfig
from plugrl.testing import ScriptedSession, make_tiny_tokenizer
from plugrl_agent_loops.env import EnvLoop
from plugrl_verifiers_env.config import VerifiersConfig
from plugrl_verifiers_env.env import VerifiersEnvironment

HERE = __name__
ROW = {"prompt": [{"role": "user", "content": "Guess my number, 1 to 10."}], "answer": "7"}


class GuessTheNumber(vf.MultiTurnEnv):
    """Higher or lower until the model says the answer."""

    async def env_response(self, messages, state, **kwargs):
        guess = messages[-1]["content"].strip()
        if guess == "boom":
            raise RuntimeError("the environment broke")
        hint = "higher" if int(guess) < int(state["answer"]) else "lower"
        return [vf.UserMessage(content=hint)]

    @vf.stop
    async def guessed(self, state) -> bool:
        steps = state["trajectory"]
        return bool(steps) and steps[-1]["completion"][-1]["content"].strip() == state["answer"]


def correct(completion, answer, **kwargs) -> float:
    return 1.0 if completion[-1]["content"].strip() == answer else 0.0


def few_turns(completion, **kwargs) -> float:
    return 1.0 / len([m for m in completion if m["role"] == "assistant"])


def no_dataset() -> Dataset:
    return Dataset.from_list([{"question": "unused", "answer": "0"}])


def load_guess(
    max_turns: int = 10, weight: float = 1.0, system_prompt: str | None = None
) -> vf.MultiTurnEnv:
    rubric = vf.Rubric(funcs=[correct, few_turns], weights=[weight, 0.0])
    return GuessTheNumber(
        dataset=no_dataset, rubric=rubric, max_turns=max_turns, system_prompt=system_prompt
    )


def load_single() -> vf.MultiTurnEnv:
    return vf.SingleTurnEnv(dataset=no_dataset, rubric=vf.Rubric(funcs=[correct]))


def load_parser() -> vf.Parser:
    return vf.Parser()


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def play(tokenizer, replies, target="load_guess", row=ROW, loop_turns=5, **args):
    config = VerifiersConfig(environment=f"{HERE}:{target}", args=args)
    environments = []

    def make():
        environments.append(VerifiersEnvironment(config, None))
        return environments[-1]

    session = ScriptedSession(
        tokenizer, replies, environment=make, config=AgentConfig(max_turns=loop_turns)
    )
    trajectory = asyncio.run(EnvLoop(AgentLoopConfig(), None).run(row, session))
    return trajectory, environments[0]


def test_the_environment_is_registered_with_its_options(plugrl_plugin_manager):
    entry = plugrl_plugin_manager.registry("environments").get("verifiers")
    assert entry.load() is VerifiersEnvironment
    assert entry.load_config() is VerifiersConfig


def test_without_verifiers_it_is_listed_unavailable_with_its_install_line(
    plugrl_plugin_manager, monkeypatch
):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if not installed
    entry = plugrl_plugin_manager.registry("environments").get("verifiers")
    assert entry.unavailable_reason == "needs verifiers (pip install 'plugrl[verifiers]')"


def test_a_multi_turn_episode_is_scored_by_the_rubric(tokenizer):
    trajectory, _ = play(tokenizer, ["3", "9", "7"], weight=2.0)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 3)
    assert [m["content"] for m in trajectory.messages] == [
        "Guess my number, 1 to 10.", "3", "higher", "9", "lower", "7"
    ]  # fmt: skip
    # the rubric scores the finished episode: its reward at the last turn's end
    assert trajectory.turn_rewards == [0.0, 0.0, 2.0]
    assert trajectory.reward == 2.0
    assert trajectory.metrics["env/correct"] == 1.0
    assert trajectory.metrics["env/few_turns"] == pytest.approx(1 / 3)
    assert trajectory.metrics["env/num_turns"] == 3.0
    whole = tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids)
    assert "<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n9" in whole


def test_a_single_turn_environment(tokenizer):
    trajectory, _ = play(tokenizer, ["7"], target="load_single")
    assert (trajectory.reward, trajectory.num_turns, trajectory.finish_reason) == (1.0, 1, "stop")
    wrong, _ = play(tokenizer, ["6"], target="load_single")
    assert (wrong.reward, wrong.num_turns) == (0.0, 1)


def test_the_environments_own_max_turns_ends_the_episode(tokenizer):
    trajectory, _ = play(tokenizer, ["1", "2", "3"], loop_turns=5, max_turns=2)
    assert (trajectory.finish_reason, trajectory.num_turns, trajectory.reward) == ("stop", 2, 0.0)


def test_the_loops_max_turns_stops_the_rollout(tokenizer):
    trajectory, environment = play(tokenizer, ["1", "2", "3"], loop_turns=2)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("max_turns", 2)
    assert trajectory.reward == 0.0  # never scored
    assert environment.rollout.done()  # closed: the verifiers rollout was cancelled


def test_an_env_response_that_raises_ends_the_trajectory_as_error(tokenizer):
    trajectory, environment = play(tokenizer, ["1", "boom", "7"])
    assert (trajectory.finish_reason, trajectory.num_turns) == ("error", 2)
    assert trajectory.metrics["env/errors"] == 1.0
    assert environment.rollout.done()


def test_a_target_that_cannot_be_imported_is_a_one_line_error():
    with pytest.raises(ValueError) as info:
        VerifiersEnvironment(VerifiersConfig(environment=f"{HERE}:load_nothing"), None)
    assert str(info.value) == (
        f"rollout.agent.env_args.environment: cannot import '{HERE}:load_nothing' "
        f"(AttributeError: module '{HERE}' has no attribute 'load_nothing')"
    )


def test_a_target_that_is_not_an_environment_is_a_one_line_error():
    with pytest.raises(ValueError) as info:
        VerifiersEnvironment(VerifiersConfig(environment=f"{HERE}:load_parser"), None)
    assert str(info.value) == (
        f"rollout.agent.env_args.environment: '{HERE}:load_parser' gave a Parser, not a "
        "verifiers MultiTurnEnv (SingleTurnEnv, ToolEnv, ... are ones)"
    )


def test_the_environment_must_be_named(plugrl_recipe):
    with pytest.raises(RecipeError) as info:
        plugrl_recipe({"rollout.agent": {"loop": "env", "env": "verifiers"}})
    assert str(info.value) == (
        "rollout.agent.env_args.environment: name the verifiers environment: an installed "
        "environment's id, a module with a load_environment function, or 'module:function' "
        "(got None)"
    )


def test_the_environments_system_prompt_opens_the_conversation(tokenizer):
    trajectory, _ = play(tokenizer, ["7"], system_prompt="Answer with a number.")
    assert trajectory.messages[0] == {"role": "system", "content": "Answer with a number."}
    assert tokenizer.decode(trajectory.prompt_ids).startswith(
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nGuess"
    )
    assert trajectory.reward == 1.0
