"""ReMax through the sync scheduler: each prompt's greedy response is generated and scored,
and its score is the baseline of that prompt's sampled responses."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow


def test_remax_subtracts_the_greedy_responses_score(tiny_task, tmp_path, monkeypatch):
    from plugrl_sync.scheduler import SyncScheduler

    baselines = []
    real = SyncScheduler.greedy_baselines

    def recording(self, parts, prompts, n):
        values = real(self, parts, prompts, n)
        baselines.append(values.clone())
        return values

    monkeypatch.setattr(SyncScheduler, "greedy_baselines", recording)
    recipe = tiny_recipe(tiny_task, tmp_path / "run", algorithm={"adv_estimator": "remax"})
    result = CliRunner().invoke(cli, ["run", str(write_recipe(tmp_path / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    records = by_step(read_records(tmp_path / "run"))
    assert "timing_s/gen_baseline" in records[1]
    n = recipe["rollout"]["n"]
    for values in baselines:
        # one greedy score per prompt, repeated for its n samples
        assert len(values) == recipe["data"]["train_batch_size"] * n
        assert (values.view(-1, n) == values.view(-1, n)[:, :1]).all()
    # advantages are score - baseline, so they are not all zero unless every sample ties
    assert records[1]["critic/advantages/max"] != records[1]["critic/advantages/min"]
