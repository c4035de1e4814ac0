import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.run.metrics import (
    StepTimer,
    compute_data_metrics,
    compute_throughput_metrics,
    length_metrics,
    mean_metrics,
)


def test_data_metrics_use_verl_names_and_respect_the_mask():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    scores = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 0.0]])
    batch = Batch(
        tensors={
            "response_mask": mask,
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.5 * mask,
            "advantages": torch.tensor([[2.0, 2, 2, 99], [-1, -1, -1, -1]]),
            "prompt_attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        }
    )
    metrics = compute_data_metrics(batch, max_response_length=4, max_prompt_length=3)
    assert metrics["critic/score/mean"] == 0.5
    assert (metrics["critic/score/max"], metrics["critic/score/min"]) == (1.0, 0.0)
    assert metrics["critic/rewards/mean"] == pytest.approx((-0.5 - 2.0) / 2)
    assert metrics["critic/advantages/max"] == 2.0  # the masked 99 is not counted
    assert metrics["critic/advantages/mean"] == pytest.approx((6 - 4) / 7)
    assert (metrics["response_length/mean"], metrics["response_length/clip_ratio"]) == (3.5, 0.5)
    assert (metrics["prompt_length/min"], metrics["prompt_length/clip_ratio"]) == (2.0, 0.5)


def test_length_metrics_of_a_rollout_batch():
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.parts.rollout import Completion

    prompts = Batch(
        tensors={
            "prompts": torch.tensor([[0, 11, 12], [21, 22, 23]]),
            "prompt_attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        },
        columns={"uid": ["a", "b"]},
    )
    completions = [
        Completion(token_ids=tokens, log_probs=[0.0] * len(tokens), finish_reason="stop")
        for tokens in ([5, 6, 7], [8], [9, 10], [])
    ]
    for index, completion in enumerate(completions):
        completion.prompt_index = index // 2
    batch = build_rollout_batch(prompts, completions, n=2, pad_token_id=0)
    metrics = length_metrics(batch, max_response_length=3, max_prompt_length=3)
    assert metrics == {
        "response_length/mean": pytest.approx(6 / 4),
        "response_length/max": 3.0,
        "response_length/min": 0.0,
        "response_length/clip_ratio": pytest.approx(1 / 4),
        "prompt_length/mean": pytest.approx(10 / 4),
        "prompt_length/max": 3.0,
        "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": pytest.approx(2 / 4),
    }
    # without limits, no clip ratios; the data metrics report the same lengths
    assert sorted(length_metrics(batch)) == sorted(
        k for k in metrics if not k.endswith("clip_ratio")
    )
    data_metrics = compute_data_metrics(batch, max_response_length=3, max_prompt_length=3)
    assert {k: data_metrics[k] for k in metrics} == metrics


def test_explained_variance():
    mask = torch.ones(2, 2)
    batch = Batch(
        tensors={
            "response_mask": mask,
            "returns": torch.tensor([[1.0, 2], [3, 4]]),
            "values": torch.tensor([[1.0, 2], [3, 4]]),
        }
    )
    assert compute_data_metrics(batch, 2)["critic/vf_explained_var"] == 1.0


def test_throughput_is_per_rank():
    metrics = compute_throughput_metrics(num_tokens=1000, step_seconds=2.0, num_ranks=2)
    assert metrics == {
        "perf/total_num_tokens": 1000.0,
        "perf/time_per_step": 2.0,
        "perf/throughput": 250.0,
    }


def test_timer_accumulates_phases():
    timer = StepTimer()
    with timer("gen"):
        pass
    with timer("gen"):
        pass
    with pytest.raises(ValueError), timer("update_actor"):
        raise ValueError
    assert set(timer.metrics()) == {"timing_s/gen", "timing_s/update_actor"}


def test_mean_metrics_averages_present_keys():
    assert mean_metrics([{"a": 1.0, "b": torch.tensor(4.0)}, {"a": 3.0}]) == {"a": 2.0, "b": 4.0}
