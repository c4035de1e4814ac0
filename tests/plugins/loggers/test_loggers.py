import json

from plugrl.recipe import TrainerConfig
from plugrl.run.metrics import read_metrics
from plugrl.testing import part_context
from plugrl_console.logger import summary_line
from plugrl_jsonl.logger import JsonlLogger


def test_summary_line_shows_what_people_watch():
    line = summary_line(
        {
            "critic/score/mean": 0.4251,
            "actor/pg_loss": -0.01,
            "val-core/plugrl/arithmetic/acc/mean@1": 0.5,
            "timing_s/step": 1.234,
            "other": 3,
        },
        step=7,
    )
    assert line == "step 7 | score 0.425 | val_acc 0.500 | pg_loss -0.0100 | step_s 1.23"


def test_jsonl_appends_flushes_and_survives_resume(tmp_path):
    logger = JsonlLogger(TrainerConfig(), part_context(run_dir=tmp_path))
    for step in (1, 2, 3):
        logger.log({"critic/score/mean": step / 10, "nan": float("nan")}, step)
    # each line is on disk before close: a killed run keeps its metrics
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 4, "cut sho')  # a line cut by kill -9
    resumed = JsonlLogger(TrainerConfig(), part_context(run_dir=tmp_path))
    resumed.log({"critic/score/mean": 0.25}, step=3)  # resuming from the step-2 checkpoint
    resumed.close()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2]["critic/score/mean"] == 0.25
    assert records[0]["nan"] == "nan"
    json.dumps(records)
