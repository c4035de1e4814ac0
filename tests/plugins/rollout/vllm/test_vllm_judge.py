"""An LLM judge served by vLLM's CPU build: the judge manager builds a frozen engine group of
its own on the ``vllm`` engine, its answers come back as ``judge_text``, the same seed gives
the same answers, and unparsable answers are retried and fall back as on the hf engine.

The judge runs in a fresh process, as in a run: the engine's start-up refuses a process that
imported vLLM before it (this suite's other modules do).

Runs where vLLM is installed (``plugins/rollout/vllm/test-env.sh``); skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

JUDGE = """
import json, sys
from plugrl.plugin.build import build_part
from plugrl.data.dataset import load_tokenizer
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig, build_recipe
from plugrl.testing import make_batch, part_context

model = sys.argv[1]
plugins = get_plugin_manager()
recipe = build_recipe(
    {
        "model": {"path": model},
        "device": {"name": "cpu"},
        "reward": {
            "manager": "judge",
            "on_error": "fallback",
            "fallback_score": -1.0,
            "judge": {
                "engine": "vllm",
                "model": {"path": model, "dtype": "float32"},
                # the judge's own context; by default vLLM takes the policy's prompt plus
                # response lengths, longer than this model's 512 positions
                "rollout": {"max_model_len": 512},
                "template": "Answer: {response}\\nRate it.",
                "max_tokens": 6,
                "max_retries": 1,
            },
        },
    },
    plugins,
)
tokenizer = load_tokenizer(ModelConfig(path=model))
batch = make_batch(
    prompt_ids=[tokenizer.encode("What is 2+2?", add_special_tokens=False)],
    response_ids=[tokenizer.encode(r, add_special_tokens=False) for r in ["4", "It is 4.", "4"]],
    n=3,
    pad_token_id=tokenizer.pad_token_id,
)
context = part_context(recipe, tokenizer=tokenizer, plugins=plugins)
manager = build_part("reward_managers", "judge", recipe.reward, context)
try:
    first, again = manager(batch), manager(batch)
finally:
    manager.close()
print(json.dumps({"first": [first.extra, first.metrics], "again": again.extra}))
"""


def test_a_judge_on_the_vllm_engine_answers_and_falls_back(tiny_model_dir: Path):
    run = subprocess.run(
        [sys.executable, "-c", JUDGE, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    extra, metrics = result["first"]
    texts = extra["judge_text"]
    assert all(isinstance(text, str) and text for text in texts)
    assert texts[0] == texts[2]  # the same sample, judged once
    # an untrained model writes no "Rating: [[N]]": two distinct samples, each retried once
    assert extra["judge_score"] == [None, None, None]
    assert metrics["reward/judge/unparsable"] == 2
    assert metrics["reward/judge/retries"] == 2
    assert metrics["critic/score/mean"] == -1.0
    assert result["again"] == extra  # seeded by the run's seed and the judge prompt
