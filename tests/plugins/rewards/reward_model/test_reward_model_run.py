"""A run through the command line whose reward is a reward model's score."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from plugrl.testing import save_tiny_model, save_tiny_reward_model
from tests.plugins.rewards.reward_model.rm_testlib import SMALL


def write_prompts(path, count):
    rows = [
        {
            "data_source": "plugrl/arithmetic",
            "prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}],
            "ability": "arithmetic",
            "reward_model": {"ground_truth": str(2 * i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(count)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.slow
def test_five_steps_of_the_quickstart_scored_by_a_reward_model(tmp_path):
    policy = save_tiny_model(tmp_path / "policy", weight_std=0.15, **SMALL)
    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=1, **SMALL)
    train = write_prompts(tmp_path / "train.parquet", 8)
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={policy}",
        f"data.train_files=[{train}]",
        "data.val_files=[]",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=2",
        "reward.manager=reward_model",
        f"reward.model.path={reward_model}",
        "reward.micro_batch_size=4",
        "trainer.total_training_steps=5",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.export_hf=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", "run", "quickstart", *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2, 3, 4, 5]
    for step in steps:
        assert isinstance(step["reward/reward_model/mean"], float)
        assert step["reward/reward_model/truncated"] == 0.0
        assert step["critic/score/mean"] == pytest.approx(step["reward/reward_model/mean"])
