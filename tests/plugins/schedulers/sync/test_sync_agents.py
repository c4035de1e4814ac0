"""Agent loops under the sync scheduler, on the simulated parts: ``single_turn`` through the
agent runtime samples what the batched path samples, a default run builds no agent runtime,
and a ``tool`` run trains on multi-turn trajectories with their masks and metrics."""

from __future__ import annotations

import json

import pytest
import torch

import plugrl
import plugrl_sync.scheduler as sync_module
from plugrl.data.batch import response_attention_mask
from plugrl.parts.agent import AgentLoop, ParsedTurn, ToolCall, Trajectory
from plugrl.run.runner import RunContext
from plugrl.run.steps import generate, generate_with_agents, sampling_params
from plugrl_sim.parts import sim_recipe
from plugrl_sync.scheduler import SyncScheduler
from tests.core.agents.agent_support import AgentTestPlugin


def always_echo(text: str) -> ParsedTurn:
    """A parser that reads one echo call out of any turn (the sim engine writes noise)."""
    return ParsedTurn(
        content="", tool_calls=[ToolCall(id="call_0", name="echo", arguments={"text": "x"}, raw="")]
    )


class EchoParserPlugin:
    @plugrl.hookimpl
    def register_tool_parsers(self, register):
        register("always_echo", f"{__name__}:always_echo")


@pytest.fixture
def sim_parts(sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin):
    """sim_parts(**recipe overrides) -> (scheduler, parts) of a sim run, weights synced."""
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    plugrl_register_plugin(EchoParserPlugin(), "agent-test-parser")
    built = []

    def make(overrides=None):
        data = sim_recipe(sim_task, tmp_path / "run", train_batch_size=4, n=2, steps=3)
        data["data"]["max_response_length"] = 48
        recipe = plugrl_recipe(overrides or {}, base=data)
        context = RunContext(recipe, tmp_path / "run", plugrl_plugin_manager, "cpu")
        scheduler = SyncScheduler(recipe.scheduler, context)
        parts = context.build_parts(scheduler.needed_capabilities())
        built.append(parts)
        parts.sync_weights()
        return scheduler, parts

    yield make
    for parts in built:
        parts.close()


def test_single_turn_through_the_agent_runtime_samples_what_the_batched_path_does(sim_parts):
    _, parts = sim_parts()
    prompts = parts.train_loader.next_batch()
    params = sampling_params(parts.recipe, 1)
    batched = generate(parts, prompts, params)
    assert parts.agents is None  # every row is single_turn: the batched path ran
    looped = generate_with_agents(parts, prompts, params, ["single_turn"] * len(prompts))
    for name in ("responses", "response_mask", "rollout_log_probs", "attention_mask", "input_ids"):
        assert torch.equal(batched[name], looped[name]), name
    for name in ("uid", "finish_reason", "min_weight_version"):
        assert list(batched[name]) == list(looped[name]), name


def test_a_default_step_logs_no_agent_metrics(sim_parts):
    scheduler, parts = sim_parts()
    metrics = scheduler.train_step(parts, 1)
    assert parts.agents is None
    assert not [key for key in metrics if key.startswith("agent/")]


def test_a_tool_step_trains_on_multi_turn_trajectories_and_logs_their_metrics(
    sim_parts, monkeypatch, tmp_path
):
    trained = []
    update = sync_module.update_from_batch

    def recording(parts, batch, timer):
        trained.append(batch)
        return update(parts, batch, timer)

    monkeypatch.setattr(sync_module, "update_from_batch", recording)
    scheduler, parts = sim_parts(
        {
            "rollout.agent": {
                "loop": "tool_agent",
                "tools": ["echo"],
                "tool_parser": "always_echo",
                "max_turns": 3,
            },
            "trainer.rollout_data_dir": str(tmp_path / "samples"),
        }
    )
    metrics = scheduler.train_step(parts, 1)
    (batch,) = trained
    assert len(batch) == 8
    mask, attention = batch["response_mask"], response_attention_mask(batch)
    # appended tool results: attended, not trained on, no log-prob, no advantage
    appended = attention.bool() & ~mask.bool()
    assert appended.any()
    assert (batch["rollout_log_probs"][appended] == 0).all()
    assert (batch["advantages"][appended] == 0).all()
    assert set(batch["finish_reason"]) <= {"max_turns", "length"}
    assert metrics["agent/num_turns/max"] <= 3
    assert metrics["agent/tool_calls/mean"] > 0
    assert metrics["agent/tool/echo/calls"] > 0
    assert metrics["agent/finish/max_turns"] + metrics["agent/finish/length"] == 1
    assert metrics["response_length/max"] <= 48
    # echo rewards each turn that called it, at the turn's end; the manager's score sits on
    # each row's last trained token
    assert (batch["turn_rewards"] != 0).any()
    scores = batch["token_level_scores"] - batch["turn_rewards"]
    for row in range(len(batch)):
        last_trained = int(mask[row].nonzero().max())
        assert set(scores[row].nonzero().flatten().tolist()) <= {last_trained}
    lines = (tmp_path / "samples" / "1.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["num_turns"] >= 1
    assert [turn["role"] for turn in first["turns"]][:2] == ["user", "assistant"]


class TwoSequenceLoop(AgentLoop):
    """A sample of two sequences that do not continue each other (a black-box agent's)."""

    async def run(self, row, session):
        out = []
        for _ in range(2):
            prompt = list(row["raw_prompt_ids"])
            completion = await session.generate(prompt, 8)
            tokens = list(completion.token_ids)
            out.append(
                Trajectory(
                    prompt_ids=prompt,
                    response_ids=tokens,
                    loss_mask=[1] * len(tokens),
                    log_probs=list(completion.log_probs),
                    token_versions=list(completion.token_versions),
                    finish_reason=completion.finish_reason,
                    weight_version=completion.weight_version,
                    turn_ends=[len(tokens) - 1] if tokens else [],
                    num_turns=1,
                )
            )
        return out


class TwoSequencePlugin:
    @plugrl.hookimpl
    def register_agent_loops(self, register):
        register("two_sequences", f"{__name__}:TwoSequenceLoop")


def test_rows_choose_their_loop_by_agent_name_and_a_sample_may_be_several_rows(
    sim_parts, plugrl_register_plugin
):
    plugrl_register_plugin(TwoSequencePlugin(), "agent-test-loop")
    _, parts = sim_parts()
    prompts = parts.train_loader.next_batch()
    prompts["agent_name"] = ["two_sequences", None, "single_turn_agent", "two_sequences"]
    params = sampling_params(parts.recipe, 1)
    batch = generate(parts, prompts, params)
    uids = list(prompts["uid"])
    # n=2 samples per prompt; a two_sequences sample is two rows with its prompt's uid
    assert list(batch["uid"]) == [uids[0]] * 4 + [uids[1]] * 2 + [uids[2]] * 2 + [uids[3]] * 4
    assert list(batch["sample_last"])[:4] == [False, True, False, True]
    scores = parts_scores(parts, batch)
    assert scores[0] == scores[1] and scores[2] == scores[3]
    assert batch["response_mask"].sum(-1)[:4].max() <= 8


def parts_scores(parts, batch):
    from plugrl.run.steps import reward_output

    return reward_output(parts, batch).token_level_scores.sum(-1).tolist()


def two_turn_trajectory(versions):
    """Five tokens: two sampled, two appended, one sampled, with these versions."""
    return Trajectory(
        prompt_ids=[1],
        response_ids=[5, 6, 7, 8, 9],
        loss_mask=[1, 1, 0, 0, 1],
        log_probs=[-1.0, -1.0, 0.0, 0.0, -1.0],
        token_versions=list(versions),
        turn_ends=[1, 4],
        num_turns=2,
    )


@pytest.mark.parametrize("mini_batch", [4, 2])
def test_a_step_whose_samples_are_several_rows_trains(
    sim_parts, plugrl_register_plugin, mini_batch
):
    """A black-box agent whose calls do not extend each other makes more rows than
    train_batch_size x n; the update trains on all of them (the fourth drill: the first update
    stopped naming actor.reuse_on_policy_log_prob, a key the user never set)."""
    plugrl_register_plugin(TwoSequencePlugin(), "agent-test-loop")
    scheduler, parts = sim_parts(
        {"rollout.agent.loop": "two_sequences", "actor.ppo_mini_batch_size": mini_batch}
    )
    metrics = scheduler.train_step(parts, 1)
    assert metrics["agent/num_sequences/mean"] == 2
    assert metrics["training/global_step"] == 1


class RefusingEnvironment(plugrl.parts.agent.Environment):
    async def reset(self, row):
        raise RuntimeError("No registered env with id: my_envs:guess")

    async def step(self, message):  # never reached
        raise AssertionError


class RefusingEnvironmentPlugin:
    @plugrl.hookimpl
    def register_environments(self, register):
        register("refusing", RefusingEnvironment)


def test_a_step_whose_trajectories_all_failed_stops_the_run_in_one_line(
    sim_parts, plugrl_register_plugin
):
    # the drill: every sample failed, and the run trained two steps on them and exited 0
    from plugrl.errors import PluginError

    plugrl_register_plugin(RefusingEnvironmentPlugin(), "agent-test-refusing")
    scheduler, parts = sim_parts({"rollout.agent": {"loop": "env", "env": "refusing"}})
    with pytest.raises(PluginError) as info:
        scheduler.train_step(parts, 1)
    message = str(info.value)
    assert message.startswith("all 8 trajectories of the step ended in error; the first: ")
    assert (
        "environment RefusingEnvironment.reset raised RuntimeError: No registered env with id: "
        "my_envs:guess; fix the agent loop, environment or tool it names"
    ) in message
    assert "\n" not in message


class DictStepEnvironment(plugrl.parts.agent.Environment):
    async def reset(self, row):
        return None

    async def step(self, message):
        return {"observation": "", "reward": 1.0, "done": True}


class DictStepPlugin:
    @plugrl.hookimpl
    def register_environments(self, register):
        register("dict_step", DictStepEnvironment)


def test_a_step_of_the_wrong_type_stops_the_run_naming_the_environment_without_noise(
    sim_parts, plugrl_register_plugin, caplog, recwarn
):
    # the drill: "fix the loop" blaming the env loop, then coroutine-never-awaited noise
    from plugrl.errors import PluginError

    plugrl_register_plugin(DictStepPlugin(), "agent-test-dict-step")
    scheduler, parts = sim_parts({"rollout.agent": {"loop": "env", "env": "dict_step"}})
    with pytest.raises(PluginError) as info:
        scheduler.train_step(parts, 1)
    assert str(info.value) == (
        "environment DictStepEnvironment.step returned dict; return "
        "plugrl.api.agents.StepResult(observation=..., reward=..., done=...)"
    )
    runtime = parts.agents
    runtime.close()
    # the other samples were cancelled and awaited before the error left the runtime: none
    # is left pending on its stopped loop, to be destroyed later with its coroutines
    # (Environment.close, a generation) never awaited
    import asyncio

    assert [t for t in asyncio.all_tasks(runtime._thread.loop) if not t.done()] == []
    assert "Task was destroyed" not in caplog.text and "never awaited" not in caplog.text


class KillAtStep:
    """Stops the run as SIGTERM does (a KeyboardInterrupt in the driver) once it logged step
    ``step``, before that step's checkpoint; once."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.done = False

    @plugrl.hookimpl
    def on_step_end(self, step, metrics):
        if step == self.step and not self.done:
            self.done = True
            raise KeyboardInterrupt(f"killed after logging step {step}")


def test_a_tool_agent_run_killed_and_resumed_trains_as_the_uninterrupted_one(
    tmp_path, plugrl_plugin_manager, plugrl_register_plugin
):
    """The real tool agent loop, tools and agent runtime, killed between the log and the
    checkpoint of step 3 (so the agents' step 3 is sampled again), resumed from step 2: the
    same metrics for every step and the same weights as the run never killed."""
    from plugrl.testing import run_scheduler
    from plugrl_sim.parts import _CHECKPOINT_FILE

    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    plugrl_register_plugin(EchoParserPlugin(), "agent-test-parser")
    overrides = {
        "rollout.agent": {
            "loop": "tool_agent",
            "tools": ["echo"],
            "tool_parser": "always_echo",
            "max_turns": 3,
        },
        "trainer.save_freq": 1,
    }
    whole = run_scheduler("sync", tmp_path / "whole", steps=4, overrides=overrides)
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "task").symlink_to(tmp_path / "whole" / "task")
    kill = KillAtStep(3)
    plugrl_register_plugin(kill, "kill-at-step-3")
    with pytest.raises(KeyboardInterrupt):
        run_scheduler("sync", tmp_path / "killed", steps=4, overrides=overrides)
    assert kill.done
    resumed = run_scheduler("sync", tmp_path / "killed", steps=4, overrides=overrides)

    assert [step for step, _ in resumed.logged] == [3, 4]
    assert resumed.metrics[4]["agent/tool_calls/mean"] > 0
    for step in (3, 4):
        again, original = resumed.metrics[step], whole.metrics[step]
        assert sorted(again) == sorted(original), (step, set(again) ^ set(original))
        for key, value in original.items():
            # clocks differ between any two runs
            if not key.startswith(("timing_s/", "perf/")) and not key.endswith("latency_s"):
                assert again[key] == value, (step, key)
    saved = [
        torch.load(run.run_dir / "global_step_4" / "actor" / _CHECKPOINT_FILE, weights_only=True)
        for run in (whole, resumed)
    ]
    assert saved[0]["update_steps"] == saved[1]["update_steps"] == 4
    assert saved[0]["shift"] == saved[1]["shift"]
    assert saved[0]["weights"].keys() == saved[1]["weights"].keys()
    for name, weight in saved[0]["weights"].items():
        assert torch.equal(saved[1]["weights"][name], weight), name
