"""Multi-turn sampling on vLLM's engine: a sync training step whose samples are tool-calling
conversations, every turn sampled by vLLM, the tool results appended between turns read but
not trained on (run in a process of its own: tests/plugins/rollout/vllm/agent_step.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.core.agents.agent_support import TOOL_TEMPLATE
from tests.e2e.e2e_support import tiny_recipe

REPOSITORY = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def chat_task(tmp_path_factory):
    from transformers import AutoTokenizer

    from plugrl_tools.quickstart.untrained import build_untrained_task

    task = build_untrained_task(tmp_path_factory.mktemp("chat-task"))
    # the tool loop renders each conversation with the model's chat template
    tokenizer = AutoTokenizer.from_pretrained(task.model)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.save_pretrained(task.model)
    return task


@pytest.mark.slow
def test_a_sync_step_on_vllm_trains_on_tool_conversations(chat_task, tmp_path):
    recipe = tiny_recipe(
        chat_task,
        tmp_path / "run",
        data={"max_prompt_length": 96, "max_response_length": 40},
        rollout={
            "engine": "vllm",
            "n": 2,
            "agent": {
                "loop": "tool",
                "tools": ["echo"],
                "tool_parser": "echo_every_turn",
                "max_turns": 3,
                # the untrained model rarely ends a turn: each turn stops at 8 tokens
                "max_turn_tokens": 8,
            },
        },
    )
    recipe_file, out = tmp_path / "recipe.json", tmp_path / "out.json"
    recipe_file.write_text(json.dumps(recipe), encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.plugins.rollout.vllm.agent_step",
            str(recipe_file),
            str(tmp_path / "run"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPOSITORY,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    step = json.loads(out.read_text(encoding="utf-8"))
    assert step["engine"] == "vllm" and step["rows"] == 8
    # every sample took more than one turn, each sampled by vLLM
    assert step["num_turns_max"] > 1 and step["echo_calls"] > 0
    # appended tool results: attended, no log-prob, no advantage; sampled tokens carry vLLM's
    assert step["appended_tokens"] > 0
    assert step["appended_log_probs_zero"] and step["appended_advantages_zero"]
    assert step["sampled_log_probs_negative"]
    assert math.isfinite(step["pg_loss"])
