"""The samples dump's file writing and JSON-safe values (the runs that write it are tested
with the schedulers, tests/plugins/schedulers/test_samples_dump.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from plugrl.run.sample_dump import json_safe, write_jsonl


def test_values_become_plain_json():
    row = {
        "tensor": torch.tensor([1.5, float("nan")]),
        "scalar": torch.tensor(2),
        "numpy": np.float32(0.5),
        "array": np.array([[1, 2]]),
        "nan": float("nan"),
        "inf": float("-inf"),
        "nested": {1: (True, None, {"x"})},
        "other": object,
    }
    assert json_safe(row) == {
        "tensor": [1.5, None],
        "scalar": 2,
        "numpy": 0.5,
        "array": [[1, 2]],
        "nan": None,
        "inf": None,
        "nested": {"1": [True, None, ["x"]]},
        "other": str(object),
    }


def test_a_file_is_replaced_whole(tmp_path):
    path = write_jsonl(tmp_path / "dump" / "3.jsonl", [{"a": 1}, {"b": "é"}])
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "é"}\n'
    write_jsonl(path, [{"a": 2}])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 2}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["3.jsonl"]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = write_jsonl(tmp_path / "1.jsonl", [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise KeyboardInterrupt  # killed while writing

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, rows())
    assert path.read_text() == '{"a": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["1.jsonl"]


def test_an_agent_sample_shows_the_prompt_its_loop_rendered_not_the_rows():
    from plugrl.agents.batch import build_trajectory_batch
    from plugrl.data.batch import Batch
    from plugrl.parts.agent import Trajectory
    from plugrl.run.sample_dump import sample_rows
    from plugrl.testing import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    row_prompt = tokenizer.encode("Play a game.", add_special_tokens=False)
    prompts = Batch(
        columns={
            "uid": ["u0"],
            "raw_prompt_ids": [row_prompt],
            "data_source": ["game"],
            "ground_truth": ["7"],
        }
    )
    # the environment opened the episode with its own message, not the row's prompt
    opening = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Guess a number from 1 to 9."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    answer = tokenizer.encode("5", add_special_tokens=False)
    trajectory = Trajectory(
        prompt_ids=tokenizer.encode(opening, add_special_tokens=False),
        response_ids=answer,
        loss_mask=[1] * len(answer),
        log_probs=[0.0] * len(answer),
        token_versions=[0] * len(answer),
        turn_ends=[len(answer) - 1],
        num_turns=1,
        messages=[{"role": "user", "content": "Guess a number from 1 to 9."}],
    )
    batch = build_trajectory_batch(prompts, [[[trajectory]]], pad_token_id=0, response_width=8)
    (line,) = sample_rows(tokenizer, batch, [1.0], {}, step=3)
    assert line["prompt"] == "user\nGuess a number from 1 to 9.\nassistant\n"
    assert line["response"] == "5"
    assert line["turns"] == [{"role": "user", "content": "Guess a number from 1 to 9."}]


def test_a_plain_sample_shows_the_rows_prompt():
    from plugrl.run.sample_dump import sample_rows
    from plugrl.testing import make_batch, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    batch = make_batch((3, 5), 2, n=1, vocab_size=300, pad_token_id=0)
    lines = sample_rows(tokenizer, batch, [0.0, 1.0], {}, step=1)
    for row, line in enumerate(lines):
        assert line["prompt"] == tokenizer.decode(
            list(batch["raw_prompt_ids"][row]), skip_special_tokens=True
        )
