import yaml

from tests.plugins.loggers.trackers_testlib import (
    EXPERIMENT,
    PROJECT,
    make_logger,
    mark_checkpoint,
    recipe,
    step_metrics,
    swanlab_records,
    swanlab_run_folders,
    swanlab_scalars,
)


def run_id_of(run_dir):
    return (run_dir / "swanlab_run_id.txt").read_text().strip()


def start_and_finish(folder):
    records = swanlab_records(folder)
    (start,) = (record["start"] for record in records if "start" in record)
    (finish,) = (record["finish"] for record in records if "finish" in record)
    return start, finish


def test_an_offline_run_in_the_run_folder_with_the_recipe_as_config(run_dir, offline_trackers):
    logger = make_logger("swanlab", run_dir)
    for step in (1, 2, 3):
        logger.log(step_metrics(step), step)
    logger.close()

    (folder,) = swanlab_run_folders(run_dir)
    start, finish = start_and_finish(folder)
    assert (start["project"], start["name"]) == (PROJECT, EXPERIMENT)
    assert start["id"] == run_id_of(run_dir)
    assert finish["state"] == "RUN_STATE_FINISHED"
    config = yaml.safe_load((folder / "files" / "config.yaml").read_text())
    assert config["actor"]["value"]["optim"]["lr"] == 1e-6
    scalars = swanlab_scalars(folder)
    assert scalars["critic/score/mean"] == {1: 0.1, 2: 0.2, 3: 0.3}
    assert scalars["val-core/plugrl/arithmetic/acc/mean@1"][2] == 0.5
    assert scalars["response_length/mean"][3] == 6 and scalars["timing_s/step"][1] == 0.5
    assert scalars["actor/pg_loss"][1] == "NaN" and scalars["actor/grad_norm"][1] == "Infinity"
    assert scalars["actor/clipped"][1] == 1 and "note" not in scalars
    assert list(offline_trackers.iterdir()) == []  # nothing in the working directory


def test_a_failed_run_ends_crashed_with_the_error(run_dir):
    logger = make_logger("swanlab", run_dir)
    logger.log({"critic/score/mean": 0.1}, 1)
    logger.close("failed", "RuntimeError: the scheduler broke")
    (folder,) = swanlab_run_folders(run_dir)
    _, finish = start_and_finish(folder)
    assert finish["state"] == "RUN_STATE_CRASHED"
    assert finish["error"] == "RuntimeError: the scheduler broke"


def test_a_resumed_run_continues_the_same_swanlab_run(run_dir):
    first = make_logger("swanlab", run_dir)
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step}, step)
    first.close()
    run_id = run_id_of(run_dir)

    mark_checkpoint(run_dir, 2)
    resumed = make_logger("swanlab", run_dir)
    for step in (3, 4):
        resumed.log({"critic/score/mean": 10 * step}, step)
    resumed.close()

    # offline, each session is a folder of its own; `swanlab sync` uploads both to one run
    folders = swanlab_run_folders(run_dir)
    assert len(folders) == 2 and run_id_of(run_dir) == run_id
    start, _ = start_and_finish(folders[1])
    assert start["id"] == run_id and start["resume"] == "RESUME_MODE_ALLOW"
    assert swanlab_scalars(folders[1])["critic/score/mean"] == {3: 30, 4: 40}


def test_a_run_that_starts_over_gets_a_new_swanlab_run(run_dir):
    make_logger("swanlab", run_dir).close()
    first = run_id_of(run_dir)
    mark_checkpoint(run_dir, 2)
    make_logger("swanlab", run_dir, recipe(resume_mode="disable")).close()
    assert run_id_of(run_dir) != first


def test_swanlab_mode_and_log_dir_are_honoured(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "elsewhere"))
    logger = make_logger("swanlab", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert not (run_dir / "swanlog").exists()
    assert len(list((tmp_path / "elsewhere").glob("run-*"))) == 1

    monkeypatch.setenv("SWANLAB_MODE", "disabled")
    logger = make_logger("swanlab", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert len(list((tmp_path / "elsewhere").glob("run-*"))) == 1
