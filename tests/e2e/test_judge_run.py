"""A GRPO run through the command line whose reward is an LLM judge: the tiny untrained model
judges the tiny policy's responses (gibberish, so every sample falls back), and the judge's
metrics are logged at every step."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow

JUDGE_METRICS = (
    "reward/judge/mean",
    "reward/judge/std",
    "reward/judge/unparsable",
    "reward/judge/retries",
    "reward/judge/latency_s",
    "reward/errors",
    "critic/score/mean",
)


def test_a_run_scored_by_a_judge_logs_the_judge_every_step(tiny_task, tmp_path, monkeypatch):
    from plugrl_judge.manager import JudgeRewardManager

    texts = []
    real = JudgeRewardManager.__call__

    def recording(self, batch):
        output = real(self, batch)
        texts.append(output.extra["judge_text"])
        return output

    monkeypatch.setattr(JudgeRewardManager, "__call__", recording)
    recipe = tiny_recipe(
        tiny_task,
        tmp_path / "run",
        reward={
            "manager": "judge",
            "on_error": "fallback",
            "fallback_score": 0.5,
            "judge": {
                "model": {"path": str(tiny_task.model), "dtype": "float32"},
                "template": "Answer: {response}\nScore it.",
                "max_tokens": 8,
                "max_retries": 1,
            },
        },
        trainer={"total_training_steps": 5, "val_before_train": False},
    )
    result = CliRunner().invoke(cli, ["run", str(write_recipe(tmp_path / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    records = by_step(read_records(tmp_path / "run"))
    assert sorted(records) == [1, 2, 3, 4, 5]
    responses = recipe["data"]["train_batch_size"] * recipe["rollout"]["n"]
    for step, record in records.items():
        missing = [name for name in JUDGE_METRICS if name not in record]
        assert not missing, f"step {step} lacks {missing}"
        # the untrained judge writes no rating: every response falls back, after one retry
        assert record["reward/errors"] == responses
        assert record["critic/score/mean"] == 0.5
        assert 1 <= record["reward/judge/unparsable"] == record["reward/judge/retries"]
    # 5 training batches, then the validation after the last step
    assert len(texts) == 6
    assert all(isinstance(text, str) and text for batch in texts for text in batch)
