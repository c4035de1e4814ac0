"""The quickstart's learning gate: a shortened quickstart must keep learning. Same task, model
shape, recipe and parts as ``plugrl quickstart``, run as its command runs them
(``load_recipe`` of the shipped recipe, then ``run_recipe``); a smaller warm start (400
examples in 200 steps of 16, against 600 in 190 of 32) and 4 steps of 16 prompts instead of 20
of 32. A run repeats exactly on a machine, so the margins below are for changes to the code,
not for chance."""

from __future__ import annotations

import json

import pytest

from plugrl_tools.quickstart import QuickstartSettings, prepare_quickstart, quickstart_overrides

GATE = QuickstartSettings(
    num_warm_start=400,
    warm_start_epochs=8,
    warm_start_batch_size=16,
    num_train=256,
    num_val=64,
)
ACCURACY = "val-core/plugrl/arithmetic/acc/mean@1"


@pytest.mark.slow
def test_a_shortened_quickstart_learns(tmp_path, capsys):
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import run_recipe

    paths = prepare_quickstart(tmp_path / "assets", settings=GATE)
    run_dir = tmp_path / "run"
    overrides = [
        *quickstart_overrides(paths),
        "data.train_batch_size=16",
        "actor.ppo_mini_batch_size=16",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.seed=0",
        "trainer.save_freq=-1",
        "trainer.export_hf=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]
    plugins = get_plugin_manager()
    run_recipe(load_recipe("quickstart", overrides, plugins), plugins)

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["step"]: r[ACCURACY] for r in records if ACCURACY in r}
    assert sorted(accuracy) == [0, 2, 4]
    # the run's first validation is the warm start's greedy evaluation, by another code path
    # (the rollout engine and the reward manager against model.generate and the scorer)
    assert accuracy[0] == pytest.approx(paths.warm_start_accuracy)
    assert accuracy[0] < 0.35, "the warm start leaves room to learn"
    # measured: 0.203 -> 0.328 -> 0.438 (+23.5 points); with 32 prompts a step, trainer seeds
    # 0, 1, 2 and 42 read +23.5, +23.5, +25.0 and +15.6, each rising at both validations
    assert accuracy[0] < accuracy[2] < accuracy[4], accuracy
    assert accuracy[4] >= accuracy[0] + 0.10, accuracy
    gain = f"{ACCURACY}: {accuracy[0]:.3f} -> {accuracy[4]:.3f}"
    assert gain in capsys.readouterr().err, "the run ends by printing the gain"
