"""The tool quickstart: the multiplication task, its chat format, and the warm start."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from plugrl_tools.quickstart import (
    ToolQuickstartSettings,
    describe,
    multiplication,
    prepare_quickstart,
    quickstart_overrides,
)
from plugrl_tools.quickstart.arithmetic import score
from plugrl_tools.quickstart.multiplication import Problem
from plugrl_tools.quickstart.tool_warmstart import (
    Toolbox,
    appended_text,
    conversation_tokens,
    make_tool_tokenizer,
    render,
    segments,
)


@pytest.fixture(scope="module")
def toolbox():
    return Toolbox()


@pytest.fixture(scope="module")
def conversations(toolbox):
    problems = [Problem(a, b) for a in (123, 456, 789, 512, 999) for b in (100, 347, 812)]
    return multiplication.warm_start_conversations(
        problems * 4, 0, toolbox.run_arguments, guess_probability=0.7, bad_call_probability=0.3
    )


@pytest.fixture(scope="module")
def tokenizer(conversations):
    texts = [t for c in conversations for t in multiplication.plain_text(c)]
    return make_tool_tokenizer(texts, vocab_size=400)


# ---------------------------------------------------------------------------------- the task


def test_a_problem_asks_and_knows_its_answer():
    problem = Problem(347, 812)
    assert problem.question == "What is 347 * 812?"
    assert problem.answer == 281764 and problem.expression == "347*812"
    assert not problem.hard and Problem(500, 100).hard


def test_the_reward_reads_the_final_answer_line_only():
    assert score("Answer: 281764", "281764") == 1.0
    assert score("Answer: 281,764", "281764") == 1.0
    assert score("Answer: 281765", "281764") == 0.0
    # a tool result holding the product earns nothing without the answer line
    response = '<tool_call>{"name":"calculator"}</tool_call>user\n<tool_response>281764'
    assert score(response, "281764") == 0.0


def test_splits_are_disjoint_deterministic_and_hard_as_asked():
    kwargs = {"num_warm_start": 100, "num_train": 200, "num_val": 40, "hard_fraction": 0.75}
    splits = multiplication.make_splits(3, **kwargs)
    assert splits == multiplication.make_splits(3, **kwargs)
    assert splits != multiplication.make_splits(4, **kwargs)
    sets = [set(splits.warm_start), set(splits.train), set(splits.val)]
    assert [len(s) for s in sets] == [100, 200, 40]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert sum(p.hard for p in splits.train) == 150 and sum(p.hard for p in splits.val) == 30
    assert all(100 <= p.left <= 999 and 100 <= p.right <= 999 for s in sets for p in s)


def test_a_hard_fraction_outside_zero_to_one_is_an_error():
    with pytest.raises(ValueError, match=r"^hard_fraction must be between 0 and 1, got 1.5$"):
        multiplication.make_splits(0, num_warm_start=1, num_train=1, num_val=1, hard_fraction=1.5)


def test_guesses_are_near_misses_never_right():
    rng = random.Random(0)
    problem = Problem(999, 999)
    guesses = [multiplication.guess(problem, rng) for _ in range(500)]
    assert problem.answer not in guesses
    assert all(abs(g - problem.answer) <= 3000 for g in guesses)


def test_warm_start_conversations_call_guess_and_err_as_asked(toolbox):
    problems = [Problem(a, 321) for a in range(100, 1000, 3)]
    conversations = multiplication.warm_start_conversations(
        problems, 1, toolbox.run_arguments, guess_probability=0.7, bad_call_probability=0.25
    )
    guessed = [p for p, c in zip(problems, conversations, strict=True) if len(c) == 2]
    called = [(p, c) for p, c in zip(problems, conversations, strict=True) if len(c) == 4]
    assert len(guessed) + len(called) == len(problems)
    assert all(p.hard for p in guessed), "only hard problems are guessed"
    hard = sum(p.hard for p in problems)
    assert 0.6 < len(guessed) / hard < 0.8
    errors = [c for _, c in called if c[2]["content"].startswith("Error: ")]
    assert 0.15 < len(errors) / len(called) < 0.35
    for problem, conversation in called:
        user, call, result, answer = conversation
        assert user == {"role": "user", "content": problem.question}
        assert call["tool_calls"][0]["function"]["name"] == "calculator"
        right = score(answer["content"], str(problem.answer)) == 1.0
        if result["content"].startswith("Error: "):
            assert not right
            assert result["content"].startswith("Error: bad arguments for tool 'calculator': ")
        else:
            assert right and result["content"] == str(problem.answer)
    for problem in guessed:
        conversation = conversations[problems.index(problem)]
        assert score(conversation[1]["content"], str(problem.answer)) == 0.0


def test_parquet_rows_follow_verls_schema(tmp_path):
    path = multiplication.write_parquet([Problem(347, 812)], "val", tmp_path / "val.parquet")
    assert pq.read_table(path).to_pylist() == [
        {
            "data_source": "plugrl/arithmetic",
            "prompt": [{"role": "user", "content": "What is 347 * 812?"}],
            "ability": "tool_use",
            "reward_model": {"style": "rule", "ground_truth": "281764"},
            "extra_info": {"split": "val", "index": 0, "hard": False},
        }
    ]


# ------------------------------------------------------------------- the chat format, tokens


def test_the_tool_tags_are_single_tokens_that_decoding_keeps(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    for tag in multiplication.TOOL_TOKENS:
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag
    text = render(tokenizer, [{"role": "user", "content": "What is 347 * 812?"}], None)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (
        reloaded(text, add_special_tokens=False)["input_ids"]
        == (tokenizer(text, add_special_tokens=False)["input_ids"])
    )
    assert reloaded.chat_template == multiplication.CHAT_TEMPLATE


def test_the_template_renders_a_tool_conversation_compactly(tokenizer, toolbox):
    messages = [
        {"role": "user", "content": "What is 347 * 812?"},
        multiplication.call_message({"expression": "347*812"}),
        {"role": "tool", "name": "calculator", "content": "281764"},
        {"role": "assistant", "content": "Answer: 281764"},
    ]
    assert render(tokenizer, messages, toolbox.schemas()) == (
        "<|im_start|>system\nTools: calculator(expression)<|im_end|>\n"
        "<|im_start|>user\nWhat is 347 * 812?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>{"name":"calculator","arguments":{"expression":"347*812"}}</tool_call>'
        "<|im_end|>"
        "<|im_start|>user\n<tool_response>281764</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nAnswer: 281764<|im_end|>"
    )


def test_parallel_results_share_one_user_turn_and_string_arguments_render_as_given(tokenizer):
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "calculator", "arguments": '{"expression":"1+1"}'}},
                {"function": {"name": "calculator", "arguments": {"expression": "2*3"}}},
            ],
        },
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "6"},
    ]
    text = render(tokenizer, messages, None, add_generation_prompt=True)
    assert text.endswith(
        '"arguments":{"expression":"1+1"}}</tool_call>'
        '<tool_call>{"name":"calculator","arguments":{"expression":"2*3"}}</tool_call><|im_end|>'
        "<|im_start|>user\n<tool_response>2</tool_response><tool_response>6</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_hermes_parser_reads_what_the_template_renders(tokenizer, toolbox):
    for arguments in ({"expression": "347*812"}, {"expr": "1 + 2"}, {"expression": 'a"b'}):
        turn = render(tokenizer, [multiplication.call_message(arguments)], None)
        text = turn[len("<|im_start|>assistant\n") : -len("<|im_end|>")]
        # the tags survive tokenizing and decoding the model's turn
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        parsed = toolbox.parse(tokenizer.decode(ids, skip_special_tokens=True))
        assert parsed.content == ""
        [call] = parsed.tool_calls
        assert (call.name, call.arguments, call.error) == ("calculator", arguments, None)


def test_pieces_join_into_the_rendering_and_only_model_turns_train(
    tokenizer, toolbox, conversations
):
    schemas = toolbox.schemas()
    for conversation in conversations:
        pieces = segments(tokenizer, conversation, schemas)
        assert "".join(text for text, _ in pieces) == render(tokenizer, conversation, schemas)
        assert [trained for _, trained in pieces][:2] == [False, True]
        ids, trained = conversation_tokens(tokenizer, conversation, schemas)
        model_text = tokenizer.decode([i for i, t in zip(ids, trained, strict=True) if t])
        assert model_text.endswith("<|im_end|>") and "<tool_response>" not in model_text
        assert "Answer: " in model_text and "What is" not in model_text


def test_appended_text_is_what_the_tool_loop_appends(tokenizer):
    before = [{"role": "user", "content": "q"}, multiplication.call_message({"expression": "2"})]
    new = [{"role": "tool", "name": "calculator", "content": "2"}]
    assert appended_text(tokenizer, before, new, None, add_generation_prompt=True) == (
        "<|im_start|>user\n<tool_response>2</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_toolbox_words_failures_as_a_run_does(toolbox):
    assert toolbox.run("calculator", {"expression": "6*7"}) == ("42", False)
    assert toolbox.run("calculator", {"expr": "6*7"}) == (
        "Error: bad arguments for tool 'calculator': calculator takes only \"expression\", "
        "not 'expr'",
        True,
    )
    assert toolbox.run("abacus", {}) == (
        "Error: unknown tool 'abacus'; the tools are: calculator.",
        True,
    )


# -------------------------------------------------------------------------------- warm start


def test_a_warm_start_teaches_the_call_format(toolbox):
    """A small model trained on calling conversations writes well-formed calls, reads the
    result and answers: tokens, loss masks, generation and the parser fit together."""
    import torch

    from plugrl.testing import make_tiny_model
    from plugrl_tools.quickstart.tool_warmstart import rollouts
    from plugrl_tools.quickstart.warmstart import train_on_sequences

    problems = [Problem(100 + 37 * i, 200 + 53 * i) for i in range(8)]
    conversations = multiplication.warm_start_conversations(
        problems, 0, toolbox.run_arguments, guess_probability=0.0, bad_call_probability=0.0
    )
    texts = [t for c in conversations for t in multiplication.plain_text(c)]
    tokenizer = make_tool_tokenizer(texts, vocab_size=300)
    model = make_tiny_model(
        tokenizer,
        seed=0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    sequences = [conversation_tokens(tokenizer, c, toolbox.schemas()) for c in conversations]
    torch.manual_seed(0)
    stats = train_on_sequences(
        model, tokenizer, sequences, epochs=60, batch_size=8, lr=3e-3, seed=0
    )
    assert stats.last_loss < stats.first_loss / 3
    for rollout in rollouts(model, tokenizer, problems[:4], toolbox, max_new_tokens=32):
        assert rollout.text.startswith('<tool_call>{"name":"calculator","arguments":')
        assert (rollout.turns, rollout.tool_calls, rollout.tool_errors) == (2, 1, 0)
        assert "<tool_response>" in rollout.text and "\nAnswer: " in rollout.text


# ------------------------------------------------------------------ build and a short run

TINY = ToolQuickstartSettings(
    num_warm_start=48, num_train=16, num_val=8, warm_start_epochs=1, warm_start_batch_size=16
)


def test_each_tool_build_phase_says_what_it_does_and_how_it_progresses(tmp_path):
    """What a user sees on stderr while the tool quickstart builds, as the arithmetic one
    shows it: each phase, the warm start's rough duration, and its steps with the time left."""
    import re
    import subprocess
    import sys

    code = (
        "from plugrl_tools.cli import _setup_logging; _setup_logging(False); "
        "from plugrl_tools.quickstart import ToolQuickstartSettings, prepare_quickstart; "
        f"prepare_quickstart({str(tmp_path / 'qs')!r}, settings=ToolQuickstartSettings("
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
    assert lines[0].startswith(f"building the quickstart's tokenizer, model and data in {tmp_path}")
    assert lines[1:4] == [
        "tokenizer: training a byte-level BPE of 512 tokens on 24 warm-start conversations "
        "(seconds)",
        "model: a Qwen2-architecture model of about 4M parameters, from seed 0",
        "warm start: 1 epochs on 24 conversations (3 steps of 8) so that the model calls the "
        "calculator, imperfectly; about 10 s on an idle 2-core CPU, longer under load",
    ]
    progress = r" \(\d+ s, about \d+ s left\)"
    for line, done in zip(lines[4:7], (1, 2, 3), strict=True):
        assert re.fullmatch(rf"warm start: {done}/3 steps, loss \d+\.\d{{3}}{progress}", line)
    assert lines[7].startswith("evaluation: greedy accuracy of the warm-started model on 8 ")
    assert re.fullmatch(rf"evaluation: 1/1 batches{progress}", lines[8])
    assert lines[9:] == [
        "data: writing the model and 16 training and 8 validation problems (verl's parquet schema)"
    ]


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-quickstart") / "assets"
    paths = prepare_quickstart(root, settings=TINY)
    warm = paths.manifest["warm_start"]
    assert paths.manifest["version"] == "tool-1" and warm["steps"] == 3
    assert {"val_tool_calls_greedy", "val_tool_errors_greedy"} <= set(warm)
    assert "calculator calls" in describe(paths)
    assert prepare_quickstart(root, settings=TINY) == paths, "a cached build is reused"
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("recipe_name", ["quickstart-tool", "quickstart-tool-async"])
def test_the_tool_quickstart_builds_and_runs_two_steps(tmp_path, tiny_assets, recipe_name):
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import run_recipe

    paths = tiny_assets

    plugins = get_plugin_manager()
    overrides = [
        *quickstart_overrides(paths),
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=2",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        "trainer.export_hf=false",
    ]
    if recipe_name.endswith("async"):
        overrides.append("scheduler.max_in_flight_per_engine=4")
    recipe = load_recipe(recipe_name, overrides, plugins)
    assert recipe.rollout.agent.loop == "tool" and recipe.rollout.agent.tools == ["calculator"]
    run_recipe(recipe, plugins)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [row for row in rows if "agent/num_turns/mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        assert {"agent/tool_calls/mean", "agent/tool_errors/mean"} <= set(row)
    assert "val-core/plugrl/arithmetic/acc/mean@1" in rows[-1]


@pytest.mark.parametrize(
    ("arguments", "recipe_name", "settings_class", "folder"),
    [
        ([], "quickstart", "QuickstartSettings", "runs/quickstart-assets"),
        (["--async"], "quickstart-async", "QuickstartSettings", "runs/quickstart-assets"),
        (
            ["--task", "tool"],
            "quickstart-tool",
            "ToolQuickstartSettings",
            "runs/quickstart-tool-assets",
        ),
        (
            ["--task", "tool", "--async", "--assets", "elsewhere"],
            "quickstart-tool-async",
            "ToolQuickstartSettings",
            "elsewhere",
        ),
    ],
)
def test_the_quickstart_command_picks_the_task_and_scheduler(
    monkeypatch, arguments, recipe_name, settings_class, folder
):
    from pathlib import Path

    from click.testing import CliRunner

    import plugrl.recipe
    import plugrl.run.runner
    import plugrl_tools.quickstart as quickstart
    from plugrl_tools.cli import cli

    seen = {}

    def prepare(out_dir, *, settings):
        seen["folder"], seen["settings"] = Path(out_dir), type(settings).__name__
        return "paths"

    def load(name, overrides, plugins):
        seen["recipe"], seen["overrides"] = name, overrides
        raise SystemExit(0)  # stop before a run

    monkeypatch.setattr(quickstart, "prepare_quickstart", prepare)
    monkeypatch.setattr(quickstart, "describe", lambda paths: "described")
    monkeypatch.setattr(quickstart, "quickstart_overrides", lambda paths: ["model.path=m"])
    monkeypatch.setattr(plugrl.recipe, "load_recipe", load)
    result = CliRunner().invoke(cli, ["quickstart", *arguments, "rollout.n=4"])
    assert result.exit_code == 0, result.output
    assert seen == {
        "folder": Path(folder),
        "settings": settings_class,
        "recipe": recipe_name,
        "overrides": ["model.path=m", "rollout.n=4"],
    }


def test_an_unknown_quickstart_task_is_refused():
    from click.testing import CliRunner

    from plugrl_tools.cli import cli

    result = CliRunner().invoke(cli, ["quickstart", "--task", "chess"])
    assert result.exit_code == 2
    assert "Invalid value for '--task': 'chess' is not one of 'arithmetic', 'tool'" in result.output
