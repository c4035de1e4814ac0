from __future__ import annotations

import io
import json
import re

import pyarrow.parquet as pq
import pytest

from plugrl_tools.quickstart import (
    QuickstartSettings,
    arithmetic,
    describe,
    prepare_quickstart,
    quickstart_overrides,
    save_untrained_model,
)
from plugrl_tools.quickstart.arithmetic import Problem, parse_answer, score, worked_answer

# ---------------------------------------------------------------------------------- the task


def test_worked_answer_with_and_without_the_carry():
    problem = Problem(47, 38)
    assert problem.carries and problem.answer == 85
    assert worked_answer(problem) == "7 + 8 = 15, carry 1\n4 + 3 + 1 = 8\nAnswer: 85"
    assert worked_answer(problem, forget_carry=True) == "7 + 8 = 15\n4 + 3 = 7\nAnswer: 75"
    plain = Problem(21, 34)
    assert not plain.carries
    assert worked_answer(plain) == worked_answer(plain, forget_carry=True)
    assert worked_answer(plain) == "1 + 4 = 5\n2 + 3 = 5\nAnswer: 55"
    assert worked_answer(Problem(87, 45)).endswith("8 + 4 + 1 = 13\nAnswer: 132")


@pytest.mark.parametrize("left", range(10, 100, 7))
@pytest.mark.parametrize("right", range(10, 100, 9))
def test_every_worked_answer_scores_right(left, right):
    problem = Problem(left, right)
    assert score(worked_answer(problem), str(problem.answer)) == 1.0
    if problem.carries:
        assert score(worked_answer(problem, forget_carry=True), str(problem.answer)) == 0.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("Answer: 81", 81),
        ("steps\nAnswer: 81\n\n", 81),
        ("Answer:81", 81),
        ("Answer: 81 apples", None),
        ("Answer: 81\nmore text", 81),  # the last Answer line, whatever follows it
        ("Answer: 81\nAnswer: 82", 82),
        ("The answer: 81", None),  # the label must open its line
        ("", None),
        ("Answer: -4", -4),
    ],
)
def test_parse_answer_reads_the_last_answer_line(response, answer):
    assert parse_answer(response) == answer


def test_score_reads_the_ground_truth_as_an_integer():
    assert score("Answer: 3", " 3 ") == 1.0
    assert score("Answer: 3", 3) == 1.0
    assert score("Answer: 4", "3") == 0.0
    with pytest.raises(ValueError, match="ground truth 'three' is not an integer"):
        score("Answer: 3", "three")


def test_splits_are_disjoint_deterministic_and_carry_as_asked():
    kwargs = {"num_warm_start": 100, "num_train": 200, "num_val": 40, "carry_fraction": 0.75}
    splits = arithmetic.make_splits(3, **kwargs)
    assert splits == arithmetic.make_splits(3, **kwargs)
    assert splits != arithmetic.make_splits(4, **kwargs)
    sets = [set(splits.warm_start), set(splits.train), set(splits.val)]
    assert [len(s) for s in sets] == [100, 200, 40]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert sum(p.carries for p in splits.train) == 150
    assert sum(p.carries for p in splits.val) == 30


def test_too_many_problems_is_an_error():
    with pytest.raises(ValueError, match=r"not enough distinct two-digit problems"):
        arithmetic.make_splits(0, num_warm_start=4000, num_train=0, num_val=0, carry_fraction=1.0)


def test_warm_start_examples_forget_the_carry_at_the_given_rate():
    problems = [Problem(a, b) for a in range(15, 95, 3) for b in range(16, 96, 3)]
    carrying = [p for p in problems if p.carries]
    examples = arithmetic.warm_start_examples(problems, 0, forget_carry_probability=0.65)
    wrong = [
        p
        for p, (_, response) in zip(problems, examples, strict=True)
        if not score(response, p.answer)
    ]
    assert all(p.carries for p in wrong)
    assert 0.55 < len(wrong) / len(carrying) < 0.75


def test_parquet_rows_follow_verls_schema(tmp_path):
    problems = [Problem(12, 34), Problem(56, 78)]
    path = arithmetic.write_parquet(problems, "train", tmp_path / "train.parquet")
    rows = pq.read_table(path).to_pylist()
    assert rows[1] == {
        "data_source": "plugrl/arithmetic",
        "prompt": [{"role": "user", "content": "What is 56 + 78?"}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": "134"},
        "extra_info": {"split": "train", "index": 1, "carries": True},
    }


# ------------------------------------------------------------------------- tokenizer, model


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    return save_untrained_model(tmp_path_factory.mktemp("untrained"), seed=0)


def test_tokenizer_ids_survive_save_and_reload(untrained):
    from transformers import AutoTokenizer

    from plugrl_tools.quickstart.build import _task

    _, _, trained = _task(0, QuickstartSettings())
    reloaded = AutoTokenizer.from_pretrained(untrained)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"
    texts = [
        "What is 47 + 38?",
        worked_answer(Problem(47, 38)),
        "Hello, wörld!  tabs\tand\n\nnewlines 12345 ünïcödé 🙂 ½",
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "   leading spaces and trailing   ",
    ]
    for text in texts:
        ids = trained(text, add_special_tokens=False)["input_ids"]
        assert reloaded(text, add_special_tokens=False)["input_ids"] == ids, text
        assert reloaded.decode(ids) == text
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    rendered = reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert reloaded.eos_token == "<|im_end|>" and reloaded.pad_token == "<|endoftext|>"
    special = reloaded.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert reloaded("<|im_start|>", add_special_tokens=False)["input_ids"] == [special[1]]
    # digits are single tokens, as in Qwen2's tokenizer
    assert len(reloaded("12345", add_special_tokens=False)["input_ids"]) == 5


def test_tiny_model_is_a_2m_qwen2_that_reloads(untrained):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(untrained, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(untrained)
    config = model.config
    assert config.model_type == "qwen2"
    assert (config.hidden_size, config.num_hidden_layers) == (256, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.vocab_size == len(tokenizer)
    assert 1.8e6 < sum(p.numel() for p in model.parameters()) < 2.3e6
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == [im_end, endoftext]


# ------------------------------------------------------------------------ prepare_quickstart

SMALL = QuickstartSettings(
    num_warm_start=24, num_train=16, num_val=8, warm_start_epochs=1, warm_start_batch_size=8
)


@pytest.mark.slow
def test_prepare_quickstart_builds_then_reuses(tmp_path):
    from plugrl.data.dataset import PromptDataset
    from plugrl.recipe import DataConfig

    root = tmp_path / "qs"
    paths = prepare_quickstart(root, seed=1, settings=SMALL)
    assert paths.model_path.joinpath("config.json").exists()
    assert pq.read_table(paths.train_file).num_rows == 16
    assert pq.read_table(paths.val_file).num_rows == 8
    manifest = json.loads((root / "quickstart.json").read_text())
    assert manifest == paths.manifest
    assert manifest["seed"] == 1 and manifest["warm_start"]["steps"] == 3
    assert 0.0 <= paths.warm_start_accuracy <= 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["qs"], "no staging folder left behind"

    stamp = (root / "quickstart.json").stat().st_mtime_ns
    again = prepare_quickstart(root, seed=1, settings=SMALL)
    assert again == paths
    assert (root / "quickstart.json").stat().st_mtime_ns == stamp, "a cached build is reused"

    # the files are what a run reads
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(paths.model_path)
    data = DataConfig(train_files=[str(paths.train_file)], max_prompt_length=32)
    dataset = PromptDataset.train(data, tokenizer)
    assert len(dataset) == 16 and dataset[0].data_source == "plugrl/arithmetic"

    overrides = quickstart_overrides(paths)
    assert f"model.path={paths.model_path}" in overrides
    assert f"data.train_files={paths.train_file}" in overrides
    assert "quickstart folder" in describe(paths)

    rebuilt = prepare_quickstart(root, seed=2, settings=SMALL)
    assert rebuilt.manifest["seed"] == 2, "another seed rebuilds"


def test_prepare_quickstart_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError) as info:
        prepare_quickstart(tmp_path, settings=SMALL)
    assert str(info.value) == (
        f"{tmp_path} exists and is not a quickstart folder; choose an empty or new folder"
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------- progress


@pytest.mark.slow
def test_each_build_phase_says_what_it_does_and_how_it_progresses(tmp_path):
    """What a user sees on stderr while the quickstart builds (not on a terminal: lines)."""
    import subprocess
    import sys

    code = (
        "from plugrl_tools.cli import _setup_logging; _setup_logging(False); "
        "from plugrl_tools.quickstart import QuickstartSettings, prepare_quickstart; "
        f"prepare_quickstart({str(tmp_path / 'qs')!r}, settings=QuickstartSettings("
        "num_warm_start=24, num_train=16, num_val=8, warm_start_epochs=1, "
        "warm_start_batch_size=8))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    # transformers' own bar of save_pretrained is not ours
    lines = [
        line for line in result.stderr.splitlines() if line and "Writing model shards" not in line
    ]
    assert lines[0] == (
        f"building the quickstart's tokenizer, model and data in {tmp_path / 'qs'}, once "
        "(later runs reuse them); about 20 s on an idle 2-core CPU, longer under load"
    )
    assert lines[1:4] == [
        "tokenizer: training a byte-level BPE of 512 tokens on 24 worked examples (seconds)",
        "model: a Qwen2-architecture model of about 2M parameters, from seed 0",
        "warm start: 1 epochs of supervised training on 24 worked examples (3 steps of 8) so "
        "that the model writes the answer format; about 10 s on an idle 2-core CPU, longer "
        "under load",
    ]
    progress = r" \(\d+ s, about \d+ s left\)"
    for line, done in zip(lines[4:7], (1, 2, 3), strict=True):
        assert re.fullmatch(rf"warm start: {done}/3 steps, loss \d+\.\d{{3}}{progress}", line)
    assert lines[7] == (
        "evaluation: greedy accuracy of the warm-started model on 8 held-out problems "
        "(generation in batches of 128; seconds)"
    )
    assert re.fullmatch(rf"evaluation: 1/1 batches{progress}", lines[8])
    assert lines[9:] == [
        "data: writing the model and 16 training and 8 validation problems (verl's parquet schema)"
    ]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(caplog):
    import logging

    from plugrl_tools.quickstart.progress import Progress

    terminal = _Terminal()
    with Progress("warm start", 4, "steps", stream=terminal) as progress:
        for _ in range(4):
            progress.update(loss=0.5)
    assert "warm start: 100%" in terminal.getvalue() and "4/4" in terminal.getvalue()
    assert "loss=0.500" in terminal.getvalue()

    with caplog.at_level(logging.INFO, logger="plugrl_tools.quickstart"):
        progress = Progress("warm start", 25, "steps", stream=io.StringIO())
        for _ in range(25):
            progress.update(loss=0.25)
    # a line after the first step, every tenth of the phase (every 2 of 25 steps) and one at
    # its end
    shown = [message.split(" (")[0] for message in caplog.messages]
    assert shown == [
        "warm start: 1/25 steps, loss 0.250",
        *(f"warm start: {done}/25 steps, loss 0.250" for done in range(2, 25, 2)),
        "warm start: 25/25 steps, loss 0.250",
    ]


def test_a_slow_phase_says_where_it_is_at_least_every_half_minute(caplog):
    """Under load a tenth of a phase takes minutes: a line comes after any step that ends
    30 s or more after the last line, with the time left."""
    import logging

    from plugrl_tools.quickstart.progress import Progress

    readings = iter([0.0, 5.0, 20.0, 36.0, 50.0, 70.0])  # start, then one per step
    with caplog.at_level(logging.INFO, logger="plugrl_tools.quickstart"):
        progress = Progress(
            "warm start", 100, "steps", stream=io.StringIO(), clock=lambda: next(readings)
        )
        for _ in range(5):
            progress.update()
    assert caplog.messages == [
        "warm start: 1/100 steps (5 s, about 495 s left)",
        "warm start: 3/100 steps (36 s, about 1164 s left)",
        "warm start: 5/100 steps (70 s, about 1330 s left)",
    ]
