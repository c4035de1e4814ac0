"""DAPO dynamic sampling (``algorithm.filter_groups``) through the sync scheduler: groups whose
responses all score the same are dropped and more prompts generated, up to
``max_num_gen_batches`` rounds."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, tiny_recipe, write_recipe

pytestmark = pytest.mark.slow

TRAIN_BATCH = 4
GEN_BATCH = 6


def dynamic_sampling_recipe(task, folder, **filter_groups):
    recipe = tiny_recipe(
        task,
        folder / "run",
        data={
            "train_files": [str(task.train_file)],
            "val_files": [str(task.val_file)],
            "train_batch_size": TRAIN_BATCH,
            "gen_batch_size": GEN_BATCH,
            "max_prompt_length": 32,
            "max_response_length": 8,
        },
        algorithm={"adv_estimator": "grpo", "filter_groups": {"enable": True, **filter_groups}},
    )
    # scores of 0 or 1: about half of the groups of two responses score the same
    recipe["reward"]["custom_function"]["kwargs"] = {"binary": True}
    return write_recipe(folder / "recipe.yaml", recipe)


def test_dynamic_sampling_trains_on_full_batches_of_varied_groups(tiny_task, tmp_path):
    recipe = dynamic_sampling_recipe(tiny_task, tmp_path, metric="score")
    result = CliRunner().invoke(cli, ["run", str(recipe)])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    records = by_step(read_records(tmp_path / "run"))
    rounds = []
    for step in (1, 2):
        record = records[step]
        num_rounds = int(record["train/num_gen_batches"])
        kept = record["filter_groups/kept_groups"]
        rounds.append(num_rounds)
        # each round generates data.gen_batch_size prompts; every group is kept or dropped
        assert kept + record["filter_groups/dropped_groups"] == GEN_BATCH * num_rounds
        assert kept >= TRAIN_BATCH
        assert record["filter_groups/surplus_groups"] == kept - TRAIN_BATCH
        # the step trains on exactly train_batch_size groups of rollout.n responses...
        tokens_per_row = record["prompt_length/mean"] + record["response_length/mean"]
        assert record["perf/total_num_tokens"] == pytest.approx(TRAIN_BATCH * 2 * tokens_per_row)
        # ...and only on groups with one response scoring 1 and the other 0
        assert record["critic/score/mean"] == 0.5
        assert record["critic/advantages/max"] == pytest.approx(2**-0.5, rel=1e-4)
        assert record["critic/advantages/min"] == pytest.approx(-(2**-0.5), rel=1e-4)
    assert max(rounds) >= 2, "no step needed a second generation round"
    # validation with rollout.val_kwargs.n=1, before the first step and after the last
    for step in (0, 2):
        assert 0.0 <= records[step]["val-core/plugrl/arithmetic/acc/mean@1"] <= 1.0


def test_dynamic_sampling_stops_with_the_key_to_raise_when_rounds_run_out(
    tiny_task, tmp_path, generations
):
    # an untrained model answers no arithmetic prompt right: every group has acc 0
    recipe = dynamic_sampling_recipe(tiny_task, tmp_path, metric="acc", max_num_gen_batches=2)
    result = CliRunner().invoke(cli, ["run", str(recipe), "trainer.val_before_train=false"])
    assert result.exit_code == 1, f"{result.stderr}{result.exception!r}"
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines()[-1] == (
        f"Error: dynamic sampling kept 0 of the {TRAIN_BATCH} prompt groups a step needs after "
        "2 generation rounds: most groups have the same 'acc' for every response (data too "
        "easy or too hard?); raise algorithm.filter_groups.max_num_gen_batches or set it to 0 "
        "for no limit"
    )
    assert generations == [GEN_BATCH, GEN_BATCH]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
