"""A recipe, data or checkpoint that cannot work stops ``plugrl run`` at start-up, before any
generation, with one line that names the culprit and the fix, and exit code 1."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import (
    REFERENCE_OVERRIDES,
    REFERENCE_STEPS,
    by_step,
    read_records,
    reference_recipe,
    run_cli,
    tiny_recipe,
    write_recipe,
)


def run_in_process(recipe, *overrides):
    return CliRunner().invoke(cli, ["run", str(recipe), *overrides])


def error_line(result) -> str:
    """The one line the CLI printed for the error; fails unless the run stopped with exit code
    1 and exactly one error line, without a traceback."""
    assert result.exit_code == 1, f"exit {result.exit_code}: {result.output}{result.exception!r}"
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def write_rows(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def arithmetic_rows(count=8):
    from plugrl_tools.quickstart.arithmetic import make_splits, verl_rows

    problems = make_splits(1, num_warm_start=0, num_train=count, num_val=0, carry_fraction=0.5)
    return verl_rows(problems.train, "train")


@pytest.mark.slow
def test_a_parquet_file_without_the_prompt_column(tiny_task, tmp_path):
    rows = [
        {("question" if key == "prompt" else key): value for key, value in row.items()}
        for row in arithmetic_rows()
    ]
    train = write_rows(tmp_path / "no-prompt.parquet", rows)
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        tiny_recipe(tiny_task, tmp_path / "run", data={"train_files": [str(train)]}),
    )
    # as a user runs it: a fresh process, its exit code and what it prints
    result = run_cli(recipe)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {train} has no column 'prompt' (it has data_source, question, ability, "
        "reward_model, extra_info); set data.prompt_key to the column with the chat messages"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_over_long_prompt_with_truncation_error(tiny_task, tmp_path, generations):
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tiny_task, tmp_path / "run"))
    line = error_line(run_in_process(recipe, "data.max_prompt_length=8", "data.truncation=error"))
    assert line.startswith(f"Error: {tiny_task.train_file} row 0: prompt is ")
    assert "tokens, over data.max_prompt_length=8; raise data.max_prompt_length" in line
    assert "data.filter_overlong_prompts=true" in line
    assert generations == []


def test_a_data_source_without_a_reward_function(tiny_task, tmp_path, generations):
    rows = arithmetic_rows()
    rows[3]["data_source"] = "my/unscored-task"
    train = write_rows(tmp_path / "unknown.parquet", rows)
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        tiny_recipe(
            tiny_task,
            tmp_path / "run",
            data={"train_files": [str(train)]},
            reward={"custom_function": {"path": None}},
        ),
    )
    line = error_line(run_in_process(recipe))
    assert line.startswith(
        f"Error: {train} row 3: no reward function for data_source 'my/unscored-task' (registered: "
    )
    assert "plugrl/arithmetic" in line
    assert "reward.custom_function.path=FILE.py" in line
    assert generations == []


def test_a_model_path_that_does_not_exist(tiny_task, tmp_path, generations):
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tiny_task, tmp_path / "run"))
    missing = tmp_path / "no-such-model"
    line = error_line(run_in_process(recipe, f"model.path={missing}"))
    assert line == (
        f"Error: model.path: {missing} is not a folder; set a local Hugging Face model folder"
    )
    assert generations == []


@pytest.mark.slow
def test_a_cut_short_checkpoint_file_stops_the_resume_and_the_advice_works(
    reference_run, tiny_task, tmp_path, generations
):
    recipe = reference_recipe(tiny_task, tmp_path)
    shutil.copytree(reference_run.run_dir, tmp_path / "run")
    latest = tmp_path / "run" / f"global_step_{REFERENCE_STEPS}"
    shard = latest / "actor" / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as file:
        file.truncate(size // 2)

    line = error_line(run_in_process(recipe, *REFERENCE_OVERRIDES))
    assert line == (
        f"Error: checkpoint {latest} is corrupt: actor/__0_0.distcp has {size // 2} bytes, the "
        f"manifest says {size}; delete that folder to resume from an earlier checkpoint, or set "
        "trainer.resume_mode=disable to start fresh"
    )
    assert generations == []

    # doing what it says resumes from the checkpoint before and redoes the last step
    shutil.rmtree(latest)
    result = run_in_process(recipe, *REFERENCE_OVERRIDES)
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    assert f"global_step_{REFERENCE_STEPS - 1} (step {REFERENCE_STEPS - 1})" in result.stderr
    records = by_step(read_records(tmp_path / "run"))
    assert sorted(records) == list(range(REFERENCE_STEPS + 1))
    assert (latest / "plugrl_checkpoint.json").exists()
