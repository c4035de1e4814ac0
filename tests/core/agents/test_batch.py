"""Trajectories into verl's batch layout: masks, log-probs, versions, turn rewards, the
scores' placement and the agent metrics."""

from __future__ import annotations

import pytest
import torch

from plugrl.agents.batch import (
    agent_metrics,
    agent_rows,
    agent_scores,
    build_trajectory_batch,
    min_sampled_version,
)
from plugrl.data.batch import Batch, left_pad, response_attention_mask
from plugrl.parts.agent import Trajectory

PAD = 0


def prompt_batch(prompts):
    ids, mask = left_pad(prompts, PAD)
    return Batch(
        tensors={"prompts": ids, "prompt_attention_mask": mask},
        columns={
            "uid": [f"u{i}" for i in range(len(prompts))],
            "raw_prompt_ids": [list(p) for p in prompts],
            "raw_prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(len(prompts))],
            "ground_truth": [str(i) for i in range(len(prompts))],
        },
    )


def two_turns(reward=None, turn_rewards=()):
    # model [11, 12], tool result [90, 91, 92] appended, model [13]
    return Trajectory(
        prompt_ids=[7, 8, 9],
        response_ids=[11, 12, 90, 91, 92, 13],
        loss_mask=[1, 1, 0, 0, 0, 1],
        log_probs=[-0.1, -0.2, -9.0, -9.0, -9.0, -0.3],
        token_versions=[4, 4, 4, 4, 4, 5],
        finish_reason="stop",
        weight_version=5,
        turn_ends=[1, 5],
        turn_rewards=list(turn_rewards),
        reward=reward,
        num_turns=2,
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        metrics={"tool_calls": 1.0, "tool_errors": 0.0, "tool/echo/calls": 1.0},
    )


def one_turn(tokens=(21, 22), version=5):
    return Trajectory(
        prompt_ids=[6],
        response_ids=list(tokens),
        loss_mask=[1] * len(tokens),
        log_probs=[-0.5] * len(tokens),
        token_versions=[version] * len(tokens),
        finish_reason="length",
        weight_version=version,
        turn_ends=[len(tokens) - 1],
        num_turns=1,
    )


def test_rows_follow_verl_layout_with_the_loss_mask_apart_from_the_attention():
    prompts = prompt_batch([[1, 2], [3]])
    batch = build_trajectory_batch(
        prompts, [[[two_turns()], [one_turn()]], [[one_turn()], [one_turn()]]], pad_token_id=PAD
    )
    assert len(batch) == 4
    assert list(batch["uid"]) == ["u0", "u0", "u1", "u1"]
    # the prompts are the trajectories' own, left-padded
    assert batch["prompts"][0].tolist() == [7, 8, 9]
    assert batch["prompts"][1].tolist() == [PAD, PAD, 6]
    assert batch["responses"][0].tolist() == [11, 12, 90, 91, 92, 13]
    assert batch["response_mask"][0].tolist() == [1, 1, 0, 0, 0, 1]
    assert response_attention_mask(batch)[0].tolist() == [1] * 6
    assert response_attention_mask(batch)[1].tolist() == [1, 1, 0, 0, 0, 0]
    assert batch["attention_mask"][1].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert batch["position_ids"][0].tolist() == list(range(9))
    assert batch["input_ids"][0].tolist() == [7, 8, 9, 11, 12, 90, 91, 92, 13]
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0, 0, 0, -0.3])
    assert list(batch["min_weight_version"]) == [4, 5, 5, 5]
    assert list(batch["num_turns"]) == [2, 1, 1, 1]
    assert list(batch["finish_reason"]) == ["stop", "length", "length", "length"]
    assert batch.meta["prompt_width"] == 3 and batch.meta["response_width"] == 6


def test_the_staleness_of_a_trajectory_is_its_oldest_sampled_token():
    trajectory = two_turns()
    trajectory.token_versions = [4, 4, 2, 2, 2, 5]  # appended tokens do not count
    assert min_sampled_version(trajectory) == 4
    assert min_sampled_version(Trajectory(prompt_ids=[1], weight_version=9)) == 9


def test_a_sample_of_several_sequences_gives_rows_with_its_uid_the_last_one_marked():
    prompts = prompt_batch([[1]])
    batch = build_trajectory_batch(
        prompts, [[[one_turn(), two_turns(reward=1.0)], [one_turn()]]], pad_token_id=PAD
    )
    assert list(batch["uid"]) == ["u0"] * 3
    assert list(batch["sample_last"]) == [False, True, True]
    manager = torch.zeros(3, 6)
    manager[:, 0] = torch.tensor([0.25, 0.5, 0.75])
    scores = agent_scores(batch, manager)
    # the episode reward (1.0) stands for the sample; both of its sequences get it on their
    # last sampled token; the other sample keeps the manager's score
    assert scores.sum(-1).tolist() == [1.0, 1.0, 0.75]
    assert scores[0, 1].item() == 1.0 and scores[1, 5].item() == 1.0


def test_turn_rewards_land_on_turn_ends_and_the_score_on_the_last_sampled_token():
    trajectory = two_turns(turn_rewards=[0.5, 0.0])
    trajectory.response_ids += [93, 94]  # ends on appended tokens (budget spent mid-append)
    trajectory.loss_mask += [0, 0]
    trajectory.log_probs += [0.0, 0.0]
    trajectory.token_versions += [5, 5]
    batch = build_trajectory_batch(prompt_batch([[1]]), [[[trajectory]]], pad_token_id=PAD)
    assert batch["turn_rewards"][0].tolist() == [0, 0.5, 0, 0, 0, 0, 0, 0]
    manager = torch.zeros(1, 8)
    manager[0, 7] = 2.0  # a manager puts it on the last response token
    scores = agent_scores(batch, manager)
    assert scores[0].tolist() == [0, 0.5, 0, 0, 0, 2.0, 0, 0]


def test_a_response_wider_than_the_width_asked_for_is_refused():
    with pytest.raises(ValueError, match="a response has 6 tokens, more than the response width 4"):
        build_trajectory_batch(
            prompt_batch([[1]]), [[[two_turns()]]], pad_token_id=PAD, response_width=4
        )


def test_agent_metrics_count_turns_tools_and_how_samples_ended():
    ending = one_turn()
    ending.finish_reason = "max_turns"
    ending.num_turns = 5
    batch = build_trajectory_batch(
        prompt_batch([[1], [2]]),
        [[[two_turns()], [one_turn()]], [[ending], [two_turns()]]],
        pad_token_id=PAD,
    )
    metrics = agent_metrics(batch)
    assert metrics["agent/num_turns/mean"] == pytest.approx(10 / 4)
    assert metrics["agent/num_turns/max"] == 5
    assert metrics["agent/tool_calls/mean"] == pytest.approx(0.5)
    assert metrics["agent/tool_errors/mean"] == 0
    assert metrics["agent/tool/echo/calls"] == 2
    assert metrics["agent/finish/stop"] == 0.5
    assert metrics["agent/finish/length"] == 0.25
    assert metrics["agent/finish/max_turns"] == 0.25


def test_a_prompt_row_reaches_a_loop_with_verls_prompt_and_reward_model_keys():
    (row,) = agent_rows(prompt_batch([[1, 2]]))
    assert row["prompt"] == [{"role": "user", "content": "q0"}]
    assert row["reward_model"] == {"ground_truth": "0"}
    assert row["raw_prompt_ids"] == [1, 2]


def test_without_agents_the_attended_response_is_the_trained_one():
    """A batch of the batched path: every response token is sampled, so the length metrics
    and the decoded texts that now read the attention mask read what they read before."""
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.parts.rollout import Completion

    completions = [
        Completion(token_ids=[4, 5, 6], log_probs=[-1.0] * 3, finish_reason="stop"),
        Completion(token_ids=[7], log_probs=[-1.0], finish_reason="stop", prompt_index=1),
    ]
    batch = build_rollout_batch(prompt_batch([[1, 2], [3]]), completions, n=1, pad_token_id=PAD)
    assert torch.equal(response_attention_mask(batch), batch["response_mask"])
    bare = Batch({"responses": batch["responses"], "response_mask": batch["response_mask"]})
    assert torch.equal(response_attention_mask(bare), batch["response_mask"])


def test_a_figure_a_loop_counts_per_sample_is_averaged_over_the_samples():
    timed = one_turn()
    timed.metrics = {"env_latency_s": 0.5}
    batch = build_trajectory_batch(prompt_batch([[1]]), [[[timed], [one_turn()]]], pad_token_id=PAD)
    assert agent_metrics(batch)["agent/env_latency_s/mean"] == 0.25


def test_an_environments_episode_reward_needs_no_reward_function_for_its_data_source(
    plugrl_recipe, plugrl_plugin_manager
):
    # the drill: an environment returning the episode reward still needed a reward function
    # for the row's data_source
    from types import SimpleNamespace

    from plugrl.compose.run_parts import build_reward_manager
    from plugrl.errors import DataError
    from plugrl.run.steps import reward_output
    from plugrl.testing import make_tiny_tokenizer

    recipe = plugrl_recipe({})
    tokenizer = make_tiny_tokenizer()
    manager = build_reward_manager(recipe, tokenizer, plugrl_plugin_manager)
    parts = SimpleNamespace(reward=manager, recipe=recipe, plugins=plugrl_plugin_manager)
    try:
        prompts = prompt_batch([[1, 2], [3]])
        prompts["data_source"] = ["my_env/puzzles", "plugrl/arithmetic"]
        scored = [[[two_turns(reward=0.75)]], [[one_turn()]]]
        batch = build_trajectory_batch(prompts, scored, pad_token_id=PAD)
        output = reward_output(parts, batch)
        # the first sample's score is its episode reward; the second is the manager's
        assert output.token_level_scores[0].sum().item() == pytest.approx(0.75)
        assert set(output.extra) and all(len(v) == 2 for v in output.extra.values())
        assert all(v[0] is None for v in output.extra.values())
        only_env = build_trajectory_batch(
            prompts.select([0]), [[[two_turns(reward=0.5)]]], pad_token_id=PAD
        )
        assert reward_output(parts, only_env).token_level_scores.sum().item() == 0.5
        no_reward = build_trajectory_batch(prompts.select([0]), [[[two_turns()]]], pad_token_id=PAD)
        with pytest.raises(DataError) as info:
            reward_output(parts, no_reward)
        assert str(info.value).startswith("no reward function for data_source 'my_env/puzzles'")
        assert str(info.value).endswith(
            "(these trajectories gave no episode reward of their own: an environment that "
            "returns one needs no reward function)"
        )
    finally:
        manager.close()


def test_at_start_up_a_data_source_without_a_function_is_a_warning_in_a_run_with_an_environment(
    plugrl_recipe, plugrl_plugin_manager, caplog
):
    from types import SimpleNamespace

    from plugrl.compose.run_parts import build_reward_manager, check_data_sources
    from plugrl.errors import DataError
    from plugrl.testing import make_tiny_tokenizer

    recipe = plugrl_recipe({})
    manager = build_reward_manager(recipe, make_tiny_tokenizer(), plugrl_plugin_manager)
    record = SimpleNamespace(data_source="my_env/puzzles", origin="train.jsonl line 1")
    data = [SimpleNamespace(records=[record])]
    try:
        with pytest.raises(DataError, match=r"^train\.jsonl line 1: no reward function"):
            check_data_sources(manager, data)
        check_data_sources(manager, data, "guess_the_number")
    finally:
        manager.close()
    assert "relies on the episode rewards of environment 'guess_the_number'" in caplog.text
