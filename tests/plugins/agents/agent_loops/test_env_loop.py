"""The ``env`` agent loop, driven by a scripted session and a guess-the-number environment."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

import plugrl
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import (
    AgentConfig,
    AgentLoopConfig,
    Environment,
    EnvironmentConfig,
    StepResult,
    Trajectory,
)
from plugrl.parts.rollout import Completion
from plugrl.plugin.manager import get_plugin_manager
from plugrl.testing import ScriptedSession, make_tiny_tokenizer, part_context
from plugrl_agent_loops.env import TRUNCATED_MARK, EnvLoop

QUESTION = [{"role": "user", "content": "Guess my number, from 1 to 10."}]


class GuessTheNumber(Environment):
    """The target is the row's ``extra_info.target``; a wrong guess is told higher or lower
    and costs 0.1; the right one earns 1. A guess of ``boom`` raises, ``wait`` never ends."""

    instances: ClassVar[list[GuessTheNumber]] = []

    def __init__(self, observation_as_messages: bool = False, opening: bool = True) -> None:
        super().__init__(EnvironmentConfig(), None)
        self.observation_as_messages = observation_as_messages
        self.opening = opening
        self.closed = 0
        self.steps: list[str] = []
        GuessTheNumber.instances.append(self)

    async def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        self.target = row["extra_info"]["target"]
        return list(QUESTION) if self.opening else None

    async def step(self, message: str) -> StepResult:
        self.steps.append(message)
        if message == "boom":
            raise RuntimeError("the environment broke")
        if message == "wait":
            await asyncio.sleep(60)
        if message == "long":
            return StepResult(observation="go " * 50, reward=0.0)
        guess = int(message)
        if guess == self.target:
            return StepResult(observation="", reward=1.0, done=True, metrics={"guesses": 1.0})
        hint = "higher" if guess < self.target else "lower"
        if self.observation_as_messages:
            return StepResult(observation=[{"role": "tool", "content": hint}], reward=-0.1)
        return StepResult(observation=hint, reward=-0.1)

    async def close(self) -> None:
        self.closed += 1


ROW = {"extra_info": {"target": 7}}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def play(tokenizer, replies, *, row=ROW, env=GuessTheNumber, **options) -> tuple[Trajectory, Any]:
    limit = options.pop("max_response_length", 256)
    session = ScriptedSession(
        tokenizer,
        replies,
        environment=env,
        config=AgentConfig(env="guess", **options),
        max_response_length=limit,
    )
    GuessTheNumber.instances.clear()
    trajectory = asyncio.run(EnvLoop(AgentLoopConfig(), None).run(row, session))
    return trajectory, session


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_env_is_a_registered_agent_loop():
    entry = get_plugin_manager().registry("agent_loops").get("env")
    assert entry.load() is EnvLoop


def test_a_three_turn_episode_keeps_sampled_tokens_and_masks_what_the_environment_added(
    tokenizer,
):
    trajectory, session = play(tokenizer, ["3", "9", "7"])
    eos = tokenizer.eos_token_id
    template = tokenizer.apply_chat_template
    assert trajectory.prompt_ids == encode(
        tokenizer, template(QUESTION, add_generation_prompt=True, tokenize=False)
    )
    hint = "\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    turns = [[*encode(tokenizer, guess), eos] for guess in ("3", "9", "7")]
    appended = [encode(tokenizer, hint.format(word)) for word in ("higher", "lower")]
    assert trajectory.response_ids == [
        *turns[0],
        *appended[0],
        *turns[1],
        *appended[1],
        *turns[2],
    ]
    assert trajectory.loss_mask == [
        *[1] * len(turns[0]),
        *[0] * len(appended[0]),
        *[1] * len(turns[1]),
        *[0] * len(appended[1]),
        *[1] * len(turns[2]),
    ]
    assert trajectory.log_probs == [-0.5 if m else 0.0 for m in trajectory.loss_mask]
    ends = [
        i
        for i, (token, sampled) in enumerate(
            zip(trajectory.response_ids, trajectory.loss_mask, strict=True)
        )
        if token == eos and sampled
    ]
    assert trajectory.turn_ends == ends and len(ends) == 3
    assert trajectory.turn_rewards == [-0.1, -0.1, 1.0]
    assert trajectory.reward == pytest.approx(0.8)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("stop", 3)
    # token in, token out: the sequence is the chat template's rendering of the conversation
    assert [m["content"] for m in trajectory.messages] == [
        QUESTION[0]["content"],
        "3",
        "higher",
        "9",
        "lower",
        "7",
    ]
    whole = tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids)
    assert whole + "\n" == template(trajectory.messages, tokenize=False)
    # each turn continues everything so far, within what is left of the response budget
    for turn, (ids, max_tokens) in enumerate(session.calls):
        done = sum(len(t) for t in turns[:turn]) + sum(len(a) for a in appended[:turn])
        assert ids == trajectory.prompt_ids + trajectory.response_ids[:done]
        assert max_tokens == 256 - done
    metrics = trajectory.metrics
    assert metrics["env/reward"] == pytest.approx(0.8)
    assert metrics["env/guesses"] == 1.0
    assert metrics["env/step_latency_s"] >= 0.0
    assert (metrics["env/errors"], metrics["env/timeouts"]) == (0.0, 0.0)
    assert GuessTheNumber.instances[0].closed == 1


def test_observations_given_as_messages_are_appended_with_their_roles(tokenizer):
    trajectory, _ = play(tokenizer, ["9", "7"], env=lambda: GuessTheNumber(True))
    assert trajectory.messages[2] == {"role": "tool", "content": "lower"}
    whole = tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids)
    assert "<|im_start|>tool\nlower<|im_end|>\n<|im_start|>assistant\n" in whole


def test_without_an_opening_the_rows_own_prompt_ids_are_the_prompt(tokenizer):
    row = {**ROW, "raw_prompt_ids": [5, 6, 7], "prompt": QUESTION}
    trajectory, session = play(tokenizer, ["7"], row=row, env=lambda: GuessTheNumber(opening=False))
    assert trajectory.prompt_ids == [5, 6, 7]
    assert session.calls[0][0] == [5, 6, 7]
    assert trajectory.messages[0] == QUESTION[0]


def test_max_turns_ends_the_episode_without_appending_the_last_observation(tokenizer):
    trajectory, session = play(tokenizer, ["1", "2", "3"], max_turns=2)
    assert (trajectory.finish_reason, trajectory.num_turns, len(session.calls)) == (
        "max_turns",
        2,
        2,
    )
    assert trajectory.loss_mask[-1] == 1  # ends on the model's last token
    assert trajectory.turn_rewards == [-0.1, -0.1]
    assert trajectory.reward == pytest.approx(-0.2)


def test_the_response_budget_counts_every_turn_and_what_was_appended(tokenizer):
    first = len(encode(tokenizer, "1")) + 1
    hint = len(encode(tokenizer, "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"))
    # room for the first turn, the hint, and two tokens of the second reply
    trajectory, session = play(tokenizer, ["1", "123456789"], max_response_length=first + hint + 2)
    assert session.calls[1][1] == 2
    assert trajectory.finish_reason == "length"
    assert len(trajectory.response_ids) == first + hint + 2
    # the cut turn is stepped all the same: the environment scores it
    cut = tokenizer.decode(encode(tokenizer, "123456789")[:2])
    assert GuessTheNumber.instances[0].steps == ["1", cut]
    assert trajectory.turn_rewards == [-0.1, -0.1]


def test_an_observation_that_leaves_no_room_for_a_turn_ends_with_length(tokenizer):
    first = len(encode(tokenizer, "1")) + 1
    trajectory, session = play(tokenizer, ["1", "2"], max_response_length=first + 3)
    assert (trajectory.finish_reason, len(session.calls)) == ("length", 1)
    assert trajectory.response_ids == [*encode(tokenizer, "1"), tokenizer.eos_token_id]


def test_a_long_observation_is_cut_and_marked(tokenizer):
    trajectory, _ = play(tokenizer, ["long", "7"], max_tool_response_length=4)
    observation = trajectory.messages[2]["content"]
    assert observation.endswith(TRUNCATED_MARK)
    cut = observation[: -len(TRUNCATED_MARK)]
    assert encode(tokenizer, cut) == encode(tokenizer, "go " * 50)[:4]
    assert trajectory.metrics["env/truncated_observations"] == 1.0
    assert trajectory.finish_reason == "stop"


def test_a_step_that_raises_ends_the_trajectory_with_error(tokenizer, caplog):
    trajectory, _ = play(tokenizer, ["1", "boom", "7"])
    assert (trajectory.finish_reason, trajectory.num_turns) == ("error", 2)
    assert trajectory.turn_rewards == [-0.1, 0.0]
    assert (trajectory.metrics["env/errors"], trajectory.metrics["env/timeouts"]) == (1.0, 0.0)
    assert GuessTheNumber.instances[0].closed == 1
    assert "environment step of sample uid-0/0 raised RuntimeError: the environment broke" in (
        caplog.text
    )


def test_a_step_that_times_out_ends_the_trajectory_with_error(tokenizer, caplog):
    trajectory, _ = play(tokenizer, ["wait", "7"], tool_timeout_s=0.05)
    assert (trajectory.finish_reason, trajectory.num_turns) == ("error", 1)
    assert (trajectory.metrics["env/errors"], trajectory.metrics["env/timeouts"]) == (0.0, 1.0)
    assert GuessTheNumber.instances[0].steps == ["wait"]
    assert "took longer than rollout.agent.tool_timeout_s (0.05s)" in caplog.text


class BrokenReset(GuessTheNumber):
    async def reset(self, row):
        raise KeyError("target")


class BrokenClose(GuessTheNumber):
    async def close(self):
        raise OSError("already gone")


def test_a_reset_that_raises_gives_an_empty_error_trajectory(tokenizer):
    trajectory, session = play(
        tokenizer, ["7"], row={**ROW, "raw_prompt_ids": [1, 2]}, env=BrokenReset
    )
    assert (trajectory.finish_reason, trajectory.prompt_ids, trajectory.response_ids) == (
        "error",
        [1, 2],
        [],
    )
    assert session.calls == []
    assert trajectory.metrics["env/errors"] == 1.0
    assert GuessTheNumber.instances[0].closed == 1


def test_a_close_that_raises_marks_the_finished_episode_as_error(tokenizer):
    trajectory, _ = play(tokenizer, ["7"], env=BrokenClose)
    assert trajectory.finish_reason == "error"
    assert trajectory.turn_rewards == [1.0]


def test_an_aborted_turn_ends_the_trajectory_without_a_step(tokenizer):
    aborted = Completion(
        token_ids=[40, 41], log_probs=[-1.0, -2.0], finish_reason="aborted", weight_version=3
    )
    trajectory, _ = play(tokenizer, ["1", aborted])
    assert trajectory.finish_reason == "aborted"
    assert GuessTheNumber.instances[0].steps == ["1"]
    assert trajectory.response_ids[-2:] == [40, 41]
    assert trajectory.weight_version == 3


def test_appended_tokens_carry_the_version_of_the_turn_before(tokenizer):
    def reply(turn, ids):
        text = ["1", "7"][turn]
        tokens = [*encode(tokenizer, text), tokenizer.eos_token_id]
        return Completion(
            token_ids=tokens,
            log_probs=[-0.1] * len(tokens),
            finish_reason="stop",
            weight_version=turn + 4,
        )

    trajectory, _ = play(tokenizer, reply)
    first = len(encode(tokenizer, "1")) + 1
    second_start = trajectory.loss_mask.index(1, first)
    assert set(trajectory.token_versions[:second_start]) == {4}
    assert set(trajectory.token_versions[second_start:]) == {5}
    assert trajectory.weight_version == 5


def test_an_empty_turn_keeps_its_reward_in_the_episode(tokenizer):
    empty = Completion(token_ids=[], log_probs=[], finish_reason="stop")
    trajectory, _ = play(tokenizer, [empty, "7"], env=GuessTheNumberEmpty)
    assert trajectory.reward == pytest.approx(0.9)
    assert trajectory.turn_rewards == [1.0]
    assert len(trajectory.turn_ends) == 1
    # an empty turn after others: its reward is not put on a token the model did not sample
    trajectory, _ = play(tokenizer, ["1", empty, "7"], env=GuessTheNumberEmpty)
    assert trajectory.reward == pytest.approx(0.8)
    assert trajectory.turn_rewards == [-0.1, 1.0]
    assert [trajectory.loss_mask[end] for end in trajectory.turn_ends] == [1, 1]


class GuessTheNumberEmpty(GuessTheNumber):
    async def step(self, message):
        if message == "":
            return StepResult(observation="say a number", reward=-0.1)
        return await super().step(message)


def test_no_opening_and_no_prompt_is_a_one_line_error(tokenizer):
    with pytest.raises(ValueError) as info:
        play(tokenizer, ["7"], env=lambda: GuessTheNumber(opening=False))
    assert str(info.value) == (
        "the env agent loop has no opening messages for sample uid-0/0: the environment's "
        "reset returned None and the row has no prompt messages; return the opening messages "
        "from reset"
    )
    assert GuessTheNumber.instances[0].closed == 1


# Qwen3's way: the last assistant turn is rendered with an (empty) thinking block, earlier
# ones without; rendering a conversation again changes its earlier turns
REWRITING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content'] + "
    "'<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_chat_template_that_rewrites_earlier_turns_still_appends_only_the_delta(tokenizer):
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = REWRITING_TEMPLATE
    trajectory, session = play(rewriting, ["3", "7"])
    hint = encode(tokenizer, "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    first = [*encode(tokenizer, "3"), tokenizer.eos_token_id]
    assert trajectory.response_ids[: len(first) + len(hint)] == first + hint
    assert session.calls[1][0] == trajectory.prompt_ids + first + hint


def test_a_chat_template_that_drops_assistant_content_is_a_one_line_error(tokenizer):
    dropping = copy.deepcopy(tokenizer)
    dropping.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ValueError) as info:
        play(dropping, ["1", "7"])
    assert str(info.value) == (
        "the tokenizer's chat template does not render an assistant message's content as "
        "given, so what comes between two turns cannot be appended to sampled tokens; use a "
        "chat template that renders assistant turns verbatim"
    )


class RegisteredGuess(GuessTheNumber):
    """Built as the registry builds environments: ``(config, context)``."""

    def __init__(self, config, context) -> None:
        super().__init__()
        self.context = context


class GuessPlugin:
    @plugrl.hookimpl
    def register_environments(self, register):
        register("guess_the_number", RegisteredGuess, description="higher or lower")


def test_an_environment_registered_by_a_plugin_is_chosen_by_the_recipe(
    plugrl_register_plugin, plugrl_recipe, tokenizer
):
    plugrl_register_plugin(GuessPlugin(), "guess")
    recipe = plugrl_recipe({"rollout.agent": {"loop": "env", "env": "guess_the_number"}})
    context = part_context(recipe)
    environment = context.plugins.registry("environments").get(recipe.rollout.agent.env).load()
    loop = context.plugins.registry("agent_loops").get(recipe.rollout.agent.loop).load()
    session = ScriptedSession(
        tokenizer,
        ["7"],
        environment=lambda: environment(None, context),
        config=recipe.rollout.agent,
    )
    trajectory = asyncio.run(loop(AgentLoopConfig(), context).run(ROW, session))
    assert (trajectory.reward, trajectory.finish_reason) == (1.0, "stop")
    with pytest.raises(RecipeError) as info:
        plugrl_recipe({"rollout.agent": {"loop": "env", "env": "guess_the_numbr"}})
    assert str(info.value).startswith(
        "rollout.agent.env: unknown environment 'guess_the_numbr': did you mean 'guess_the_number'?"
    )


def test_a_failed_step_says_which_environment_failed_in_the_trajectory(tokenizer):
    trajectory, _ = play(tokenizer, ["1", "boom", "7"])
    assert trajectory.error == (
        "environment GuessTheNumber.step raised RuntimeError: the environment broke"
    )


class StepReturnsADict(GuessTheNumber):
    async def step(self, message: str) -> Any:
        return {"observation": "", "reward": 1.0, "done": True}


class SynchronousStep(GuessTheNumber):
    def step(self, message: str) -> Any:  # type: ignore[override]
        return StepResult(observation="", reward=1.0, done=True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            StepReturnsADict,
            "environment StepReturnsADict.step returned dict; return "
            "plugrl.api.agents.StepResult(observation=..., reward=..., done=...)",
        ),
        (
            SynchronousStep,
            "environment SynchronousStep.step returned StepResult, not a coroutine; define it "
            "as 'async def step(self, action) -> StepResult'",
        ),
    ],
)
def test_a_step_of_the_wrong_type_names_the_environment_and_step_result(tokenizer, env, message):
    # the drill: a wrong type ended the run blaming the env loop ("fix the loop")
    with pytest.raises(PluginError) as info:
        play(tokenizer, ["7"], env=env)
    assert str(info.value) == message
    assert GuessTheNumber.instances[0].closed == 1


class AlwaysBroken(RegisteredGuess):
    async def reset(self, row):
        raise RuntimeError("no registered env with id: gsm9k")


class BrokenPlugin:
    @plugrl.hookimpl
    def register_environments(self, register):
        register("always_broken", AlwaysBroken, description="fails every episode")


def test_a_step_whose_trajectories_all_ended_in_error_stops_the_run_in_one_line(
    plugrl_register_plugin, plugrl_recipe, plugrl_plugin_manager
):
    # the drill: every sample failed, and the run trained two steps on them and exited 0
    from plugrl.agents.batch import check_not_all_errors
    from plugrl.agents.session import AgentRuntime
    from plugrl.parts.rollout import SamplingParams
    from tests.core.agents.agent_support import ScriptedEngines, tool_tokenizer

    plugrl_register_plugin(BrokenPlugin(), "broken")
    recipe = plugrl_recipe({"rollout.agent": {"loop": "env", "env": "always_broken"}})
    chat_tokenizer = tool_tokenizer()
    engines = ScriptedEngines(chat_tokenizer, lambda request, turn: "7")
    runtime = AgentRuntime(recipe, plugrl_plugin_manager, chat_tokenizer, engines)
    try:
        rows = [{"uid": f"u{i}", "prompt": QUESTION, "raw_prompt_ids": [1]} for i in range(2)]
        samples = runtime.run(rows, ["env", "env"], SamplingParams(n=2, seed=1, max_tokens=16))
    finally:
        runtime.close()
    trajectories = [t for row in samples for sample in row for t in sample]
    with pytest.raises(PluginError) as info:
        check_not_all_errors(trajectories)
    assert str(info.value) == (
        "all 4 trajectories of the step ended in error; the first: agent loop 'env', sample "
        "u0/0: environment AlwaysBroken.reset raised RuntimeError: no registered env with id: "
        "gsm9k; fix the agent loop, environment or tool it names"
    )
    trajectories[-1].finish_reason = "stop"
    check_not_all_errors(trajectories)  # one that ended well: the step trains
