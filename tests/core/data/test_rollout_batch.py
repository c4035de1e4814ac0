from __future__ import annotations

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.data.rollout_batch import build_rollout_batch
from plugrl.parts.rollout import Completion

PAD = 0


def prompt_batch() -> Batch:
    # prompt 0 has 2 tokens, prompt 1 has 3 (left-padded to 3)
    return Batch(
        tensors={
            "prompts": torch.tensor([[PAD, 11, 12], [21, 22, 23]]),
            "prompt_attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        },
        columns={
            "uid": ["0-0", "0-1"],
            "ground_truth": ["3", "5"],
            "raw_prompt_ids": [[11, 12], [21, 22, 23]],
        },
        meta={"epoch": 0},
    )


def completion(
    prompt: int, tokens: list[int], reason: str = "stop", version: int = 2
) -> Completion:
    return Completion(
        prompt_index=prompt,
        token_ids=tokens,
        log_probs=[-0.1 * (i + 1) for i in range(len(tokens))],
        finish_reason=reason,
        weight_version=version,
        # a partial rollout: the first token from the version before
        token_versions=[version - 1] + [version] * (len(tokens) - 1) if tokens else [],
    )


def completions() -> list[Completion]:
    return [
        completion(0, [5, 6, 7]),
        completion(0, [8], reason="length"),
        completion(1, [9, 10]),
        completion(1, [], reason="aborted"),
    ]


def test_rows_are_repeated_interleaved_with_responses_right_padded():
    batch = build_rollout_batch(prompt_batch(), completions(), n=2, pad_token_id=PAD)
    assert len(batch) == 4
    assert list(batch["uid"]) == ["0-0", "0-0", "0-1", "0-1"]
    assert list(batch["ground_truth"]) == ["3", "3", "5", "5"]
    assert batch["responses"].tolist() == [[5, 6, 7], [8, PAD, PAD], [9, 10, PAD], [PAD] * 3]
    assert batch["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert batch["prompts"].tolist() == [[PAD, 11, 12]] * 2 + [[21, 22, 23]] * 2
    assert batch["input_ids"].tolist()[0] == [PAD, 11, 12, 5, 6, 7]
    assert batch["attention_mask"].tolist() == [
        [0, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 0],
    ]
    # positions count real tokens only: padding on the left does not shift them
    assert batch["position_ids"].tolist()[0] == [0, 0, 1, 2, 3, 4]
    assert batch["position_ids"].tolist()[2] == [0, 1, 2, 3, 4, 4]
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch["rollout_log_probs"][1].tolist() == pytest.approx([-0.1, 0.0, 0.0])
    assert list(batch["finish_reason"]) == ["stop", "length", "stop", "aborted"]
    assert list(batch["weight_version"]) == [2] * 4
    # the oldest version behind a token; an empty response has only the version it ended at
    assert list(batch["min_weight_version"]) == [1, 1, 1, 2]
    # the prompt batch's meta, plus the layout Batch.concat pads by
    assert batch.meta == {"epoch": 0, "prompt_width": 3, "response_width": 3, "pad_token_id": PAD}
    for name in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert batch[name].dtype == torch.long, name
    assert batch["rollout_log_probs"].dtype == torch.float32


def test_response_width_pads_to_a_fixed_size():
    batch = build_rollout_batch(
        prompt_batch(), completions(), n=2, pad_token_id=PAD, response_width=5
    )
    assert batch["responses"].shape == (4, 5)
    assert batch["input_ids"].shape == (4, 8)


def test_all_empty_responses_still_give_one_column():
    empty = [completion(i // 2, [], reason="aborted") for i in range(4)]
    batch = build_rollout_batch(prompt_batch(), empty, n=2, pad_token_id=PAD)
    assert batch["responses"].shape == (4, 1)
    assert batch["response_mask"].sum() == 0


def test_wrong_number_of_completions():
    with pytest.raises(ValueError, match=r"expected 2 prompts x n=2 = 4 completions, got 3"):
        build_rollout_batch(prompt_batch(), completions()[:3], n=2, pad_token_id=PAD)


def test_completions_out_of_prompt_order():
    shuffled = completions()
    shuffled[1], shuffled[2] = shuffled[2], shuffled[1]
    with pytest.raises(ValueError, match=r"completion 1 belongs to prompt 1, expected 0"):
        build_rollout_batch(prompt_batch(), shuffled, n=2, pad_token_id=PAD)


def test_log_probs_must_match_tokens():
    broken = completions()
    broken[0].log_probs = [-0.1]
    with pytest.raises(ValueError, match=r"completion 0 has 3 tokens but 1 log-probs"):
        build_rollout_batch(prompt_batch(), broken, n=2, pad_token_id=PAD)


def test_response_longer_than_the_width():
    with pytest.raises(
        ValueError, match=r"a response has 3 tokens, more than the response width 2"
    ):
        build_rollout_batch(prompt_batch(), completions(), n=2, pad_token_id=PAD, response_width=2)


def test_prompt_batch_needs_its_tensors():
    with pytest.raises(KeyError, match=r"build_rollout_batch needs batch columns prompts"):
        build_rollout_batch(Batch(columns={"uid": ["a"]}), [], n=1, pad_token_id=PAD)
