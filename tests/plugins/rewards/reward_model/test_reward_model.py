"""The reward_model manager on a tiny sequence-classification model built here: its scores
against a forward pass of the same model done by hand, micro-batching, padding, truncation,
the template fallback, failures and each start-up error."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from plugrl.errors import RecipeError
from plugrl.parts.scoring import ScoringError
from plugrl.testing import (
    make_tiny_reward_model,
    make_tiny_tokenizer,
    save_tiny_model,
    save_tiny_reward_model,
)
from plugrl_reward_model.manager import RewardModelManager
from tests.plugins.rewards.reward_model.rm_testlib import (
    PROMPTS,
    RESPONSES,
    SMALL,
    by_hand,
    rm_batch,
)


def placed(output):
    """Each row's score and the token it sits on."""
    scores = output.token_level_scores
    return [(float(row.sum()), int(row.nonzero().max()) if row.any() else 0) for row in scores]


# ------------------------------------------------------------------------------ scoring


def test_scores_are_the_models_forward_on_its_own_template(build, rm_folder, policy_tokenizer):
    manager = build(model={"path": str(rm_folder)}, micro_batch_size=3)
    assert isinstance(manager, RewardModelManager)
    batch = rm_batch(policy_tokenizer, width=12)
    output = manager(batch)
    expected = by_hand(rm_folder)
    assert len(set(expected)) == len(expected)  # the tiny model tells the texts apart
    lengths = batch["response_mask"].sum(-1).tolist()
    for (score, position), want, length in zip(placed(output), expected, lengths, strict=True):
        assert score == pytest.approx(want, abs=1e-5)
        assert position == length - 1
    assert output.token_level_scores.count_nonzero() == len(expected)
    assert output.extra["rm_score"] == pytest.approx(expected, abs=1e-5)
    metrics = output.metrics
    assert metrics["reward/reward_model/mean"] == pytest.approx(sum(expected) / 4, abs=1e-5)
    assert metrics["reward/reward_model/std"] == pytest.approx(
        float(torch.tensor(expected).std(unbiased=False)), abs=1e-5
    )
    assert metrics["critic/score/max"] == pytest.approx(max(expected), abs=1e-5)
    assert metrics["reward/reward_model/truncated"] == 0.0
    assert metrics["reward/errors"] == 0.0
    assert metrics["timing_s/reward_model"] > 0


def test_micro_batch_sizes_give_the_same_scores(build, rm_folder, policy_tokenizer):
    batch = rm_batch(policy_tokenizer)
    one = manager_scores(build(model={"path": str(rm_folder)}, micro_batch_size=1), batch)
    four = manager_scores(build(model={"path": str(rm_folder)}, micro_batch_size=4), batch)
    assert four == pytest.approx(one, abs=1e-5)


def manager_scores(manager, batch):
    return manager(batch).extra["rm_score"]


def test_left_and_right_padding_give_the_same_scores(build, rm_folder, policy_tokenizer):
    manager = build(model={"path": str(rm_folder)})
    sequences, _ = manager.encode(rm_batch(policy_tokenizer))
    assert len({len(s) for s in sequences}) > 1  # the micro-batch is padded
    right = manager._runner.score([sequences], padding_side="right")[0]
    left = manager._runner.score([sequences], padding_side="left")[0]
    assert left == pytest.approx(right, abs=1e-5)
    assert right == pytest.approx(by_hand(rm_folder), abs=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_long_texts_are_cut_to_max_length_and_counted(build, rm_folder, policy_tokenizer, side):
    manager = build(model={"path": str(rm_folder)}, max_length=28, truncation=side)
    batch = rm_batch(policy_tokenizer)
    sequences, truncated = manager.encode(batch)
    full, _ = build(model={"path": str(rm_folder)}).encode(batch)
    over = [len(s) > 28 for s in full]
    assert 0 < sum(over) < len(over)
    assert truncated == sum(over)
    assert [len(s) for s in sequences] == [min(len(s), 28) for s in full]
    output = manager(batch)
    assert output.metrics["reward/reward_model/truncated"] == float(sum(over))
    expected = by_hand(rm_folder, max_length=28, side=side)
    assert output.extra["rm_score"] == pytest.approx(expected, abs=1e-5)


def test_max_length_defaults_to_the_models_positions(build, rm_folder):
    assert build(model={"path": str(rm_folder)}).max_length == 512


def test_an_rm_without_a_chat_template_reads_the_texts_joined(
    build, tmp_path, policy_tokenizer, caplog
):
    from transformers import AutoModelForSequenceClassification

    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = None
    make_tiny_reward_model(tokenizer, **SMALL).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    manager = build(model={"path": str(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        first = manager(rm_batch(policy_tokenizer)).extra["rm_score"]
        manager(rm_batch(policy_tokenizer))
    said = [r.getMessage() for r in caplog.records if "no chat template" in r.getMessage()]
    assert said == [
        f"reward: the reward model's tokenizer ({tmp_path}) has no chat template; it reads the "
        "prompt and the response joined by newlines"
    ]
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    for prompt, response, score in zip(PROMPTS, RESPONSES, first, strict=True):
        ids = tokenizer(f"{prompt}\n{response}")["input_ids"]
        with torch.no_grad():
            assert score == pytest.approx(float(model(torch.tensor([ids])).logits[0, 0]), abs=1e-5)


def test_without_messages_the_decoded_prompt_is_the_user_turn(
    build, rm_folder, policy_tokenizer, caplog
):
    manager = build(model={"path": str(rm_folder)})
    batch = rm_batch(policy_tokenizer, messages=False)
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        chats = manager.prompt_messages(batch)
    assert chats[0] == [{"role": "user", "content": "user\nWhat is 2 + 2?\nassistant\n"}]
    assert any("no raw_prompt column" in r.getMessage() for r in caplog.records)
    assert len(manager(batch).extra["rm_score"]) == 4


def test_a_multi_output_model_scores_with_score_index(build, tmp_path, policy_tokenizer):
    folder = save_tiny_reward_model(tmp_path, num_labels=3, **SMALL)
    output = build(model={"path": str(folder)}, score_index=2)(rm_batch(policy_tokenizer))
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    manager = build(model={"path": str(folder)}, score_index=2)
    sequences, _ = manager.encode(rm_batch(policy_tokenizer))
    with torch.no_grad():
        want = [float(model(torch.tensor([s])).logits[0, 2]) for s in sequences]
    assert output.extra["rm_score"] == pytest.approx(want, abs=1e-5)


def test_the_tiny_reward_model_is_deterministic(tmp_path, rm_folder):
    again = save_tiny_reward_model(tmp_path, seed=0, **SMALL)
    assert (again / "model.safetensors").read_bytes() == (
        rm_folder / "model.safetensors"
    ).read_bytes()
    config = json.loads((again / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"]
    assert config["pad_token_id"] is not None


# ------------------------------------------------------------------------------ failures


def test_a_failed_forward_stops_the_run_under_raise(build, rm_folder, policy_tokenizer):
    manager = build(model={"path": str(rm_folder)})
    manager._runner.score = _out_of_memory
    with pytest.raises(ScoringError) as info:
        manager(rm_batch(policy_tokenizer))
    assert str(info.value) == (
        f"the reward model {rm_folder} failed on 4 of 4 samples: RuntimeError: out of memory; "
        "fix the cause, or set reward.on_error=score_zero to score such samples 0 and count "
        "them in reward/errors"
    )


def test_a_failed_forward_scores_the_fallback(build, rm_folder, policy_tokenizer):
    manager = build(model={"path": str(rm_folder)}, on_error="fallback", fallback_score=-1.0)
    manager._runner.score = _out_of_memory
    output = manager(rm_batch(policy_tokenizer))
    assert [score for score, _ in placed(output)] == [-1.0] * 4
    assert output.metrics["reward/errors"] == 4.0
    assert output.extra["rm_score"] == [None] * 4
    assert "reward/reward_model/mean" not in output.metrics


def _out_of_memory(micro_batches, padding_side="right"):
    raise RuntimeError("CUDA error\nout of memory")


# ------------------------------------------------------------------------------ start-up errors


def test_the_path_must_be_set(build):
    with pytest.raises(RecipeError) as info:
        build()
    assert str(info.value) == (
        "reward.model.path: not set; point it at the Hugging Face folder of a "
        "sequence-classification reward model"
    )


def test_the_path_must_be_a_folder(build, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(RecipeError) as info:
        build(model={"path": str(missing)})
    assert str(info.value) == (
        f"reward.model.path: {missing} is not a folder; point it at the local Hugging Face "
        "folder of a sequence-classification reward model"
    )


def test_the_path_must_be_a_model_folder(build, tmp_path):
    with pytest.raises(RecipeError) as info:
        build(model={"path": str(tmp_path)})
    assert str(info.value) == (
        f"reward.model.path: {tmp_path} is not a model folder (no config.json); point it at a "
        "folder that save_pretrained wrote"
    )


def test_a_causal_language_model_is_not_a_reward_model(build, tmp_path):
    folder = save_tiny_model(tmp_path, **SMALL)
    with pytest.raises(RecipeError) as info:
        build(model={"path": str(folder)})
    assert str(info.value) == (
        f"reward.model.path: {folder} holds a Qwen2ForCausalLM, not a sequence classifier; a "
        "reward model must be one (an architecture ending in ForSequenceClassification, as "
        "AutoModelForSequenceClassification loads, scoring a whole sequence)"
    )


def test_several_outputs_need_a_score_index(build, tmp_path):
    folder = save_tiny_reward_model(tmp_path, num_labels=3, **SMALL)
    with pytest.raises(RecipeError) as info:
        build(model={"path": str(folder)})
    assert str(info.value) == (
        f"reward.score_index: the reward model {folder} has 3 outputs per sequence "
        "(num_labels 3); set reward.score_index to the one that is the score (0 to 2)"
    )
    with pytest.raises(RecipeError) as info:
        build(model={"path": str(folder)}, score_index=3)
    assert str(info.value) == "reward.score_index: 3 is past the reward model's 3 outputs (0 to 2)"


def test_the_section_must_be_read_into_its_config_class(rm_folder, make_recipe, policy_tokenizer):
    from plugrl.errors import PluginError
    from plugrl.testing import part_context

    recipe = make_recipe({})
    context = part_context(recipe, tokenizer=policy_tokenizer)
    with pytest.raises(PluginError) as info:
        RewardModelManager(recipe.reward, context)
    assert str(info.value) == (
        "the reward_model manager got a RewardConfig reward section; build the recipe with "
        "plugrl.recipe.build_recipe so it is read into RewardModelConfig"
    )


def test_a_custom_function_is_said_to_be_unused(build, rm_folder, scorer_file, caplog):
    path = scorer_file("def compute_score(data_source, solution_str, ground_truth):\n  return 1\n")
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        build(model={"path": str(rm_folder)}, custom_function={"path": str(path)})
    assert [r.getMessage() for r in caplog.records] == [
        "reward: reward.custom_function is not used by the reward_model manager: the reward "
        "model's score is the reward (as in verl with reward_model.enable); weigh the two with "
        "reward.components to use both"
    ]


def test_offload_changes_nothing_on_the_cpu(build, rm_folder, policy_tokenizer):
    manager = build(model={"path": str(rm_folder)}, offload=True)
    assert manager._runner.offload is False
    assert next(manager._runner.model.parameters()).device.type == "cpu"
    scores = manager(rm_batch(policy_tokenizer)).extra["rm_score"]
    assert scores == pytest.approx(by_hand(rm_folder), abs=1e-5)


def test_the_model_runs_on_the_device_the_run_gives(make_recipe, plugins, rm_folder):
    from plugrl.compose.run_parts import build_reward_manager
    from plugrl_cpu.device import CpuDevice

    recipe = make_recipe({"manager": "reward_model", "model": {"path": str(rm_folder)}})
    device = CpuDevice()
    manager = build_reward_manager(recipe, make_tiny_tokenizer(), plugins, device)
    assert manager.context.device is device
    assert (manager.device_type, manager.dtype) == ("cpu", "float32")
    assert manager._runner.model.dtype == torch.float32


def test_a_component_section_with_the_runs_custom_function_is_not_warned_about(
    make_recipe, plugins, rm_folder, scorer_file, policy_tokenizer, caplog
):
    import attrs

    from plugrl.testing import part_context

    path = scorer_file("def compute_score(data_source, solution_str, ground_truth):\n  return 1\n")
    reward = {"manager": "reward_model", "model": {"path": str(rm_folder)}}
    recipe = make_recipe({**reward, "custom_function": {"path": str(path)}})
    section = attrs.evolve(recipe.reward)  # a component's own copy of the reward keys
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        manager = RewardModelManager(
            section, part_context(recipe, tokenizer=policy_tokenizer, plugins=plugins)
        )
    manager.close()
    assert caplog.records == []


def test_ray_placement_without_ray_is_one_line(build, rm_folder, make_recipe, monkeypatch):
    from plugrl.cluster.ray_group import RAY_INSTALL, ray_needs
    from plugrl.errors import PluginError

    reward = {"model": {"path": str(rm_folder)}, "placement": "ray"}
    assert ray_needs(make_recipe({"manager": "reward_model", **reward})) == ["reward.placement=ray"]
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    with pytest.raises(PluginError) as info:
        build(**reward)
    assert str(info.value) == (
        f"reward.placement=ray needs Ray, which is not installed here: {RAY_INSTALL}"
    )
