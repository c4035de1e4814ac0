from tests.plugins.loggers.trackers_testlib import (
    EXPERIMENT,
    PROJECT,
    make_logger,
    mark_checkpoint,
    recipe,
    step_metrics,
    wandb_history,
    wandb_inspect,
    wandb_run_folders,
)


def run_id_of(run_dir):
    return (run_dir / "wandb_run_id.txt").read_text().strip()


def test_an_offline_run_in_the_run_folder_with_the_recipe_as_config(run_dir, offline_trackers):
    logger = make_logger("wandb", run_dir)
    for step in (1, 2, 3):
        logger.log(step_metrics(step), step)
    logger.close()

    (folder,) = wandb_run_folders(run_dir)
    summary = wandb_inspect(folder, "--summary")
    assert (summary["project"], summary["name"]) == (PROJECT, EXPERIMENT)
    assert summary["run_id"] == run_id_of(run_dir) and folder.name.endswith(summary["run_id"])
    assert summary["state"] == "finished" and summary["exit_code"] == 0
    assert summary["config"]["actor"]["optim"]["lr"] == 1e-6
    assert summary["config"]["trainer"]["logger"] == ["console", "jsonl"]
    history = wandb_history(folder)
    assert sorted(history) == [1, 2, 3]
    assert history[2]["critic/score/mean"] == 0.2
    assert history[2]["val-core/plugrl/arithmetic/acc/mean@1"] == 0.5
    assert history[3]["response_length/mean"] == 6 and history[1]["timing_s/step"] == 0.5
    assert history[1]["actor/pg_loss"] == "NaN" and history[1]["actor/grad_norm"] == "Infinity"
    assert history[1]["actor/clipped"] == 1 and "note" not in history[1]
    assert list(offline_trackers.iterdir()) == []  # nothing in the working directory


def test_a_failed_run_ends_failed(run_dir):
    logger = make_logger("wandb", run_dir)
    logger.log({"critic/score/mean": 0.1}, 1)
    logger.close("failed", "RuntimeError: the scheduler broke")
    (folder,) = wandb_run_folders(run_dir)
    summary = wandb_inspect(folder, "--summary")
    assert (summary["state"], summary["exit_code"]) == ("failed", 1)


def test_a_resumed_run_continues_the_same_wandb_run(run_dir):
    first = make_logger("wandb", run_dir)
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step}, step)
    first.close()
    run_id = run_id_of(run_dir)

    mark_checkpoint(run_dir, 2)
    resumed = make_logger("wandb", run_dir)
    for step in (3, 4):
        resumed.log({"critic/score/mean": 10 * step}, step)
    resumed.close()

    # offline, each session is a folder of its own; `wandb sync` uploads both to one run
    folders = wandb_run_folders(run_dir)
    assert len(folders) == 2 and run_id_of(run_dir) == run_id
    records = wandb_inspect(folders[1])
    (start,) = (record["run"] for record in records if record["type"] == "run")
    assert start["run_id"] == run_id and start["resume"] is True
    assert {s: h["critic/score/mean"] for s, h in wandb_history(folders[1]).items()} == {
        3: 30,
        4: 40,
    }


def test_a_run_that_starts_over_gets_a_new_wandb_run(run_dir):
    make_logger("wandb", run_dir).close()
    first = run_id_of(run_dir)
    mark_checkpoint(run_dir, 2)
    make_logger("wandb", run_dir, recipe(resume_mode="disable")).close()
    assert run_id_of(run_dir) != first


def test_wandb_mode_and_dir_are_honoured(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    logger = make_logger("wandb", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert not (run_dir / "wandb").exists()
    assert len(list((tmp_path / "elsewhere" / "wandb").glob("offline-run-*"))) == 1

    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = make_logger("wandb", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert len(list((tmp_path / "elsewhere" / "wandb").glob("*run-*"))) == 1
