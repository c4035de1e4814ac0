import math

import pytest

from tests.plugins.loggers.trackers_testlib import make_logger, step_metrics, tensorboard_events


def test_scalars_per_step_and_the_recipe_as_text(run_dir, offline_trackers):
    logger = make_logger("tensorboard", run_dir)
    for step in (1, 2, 3):
        logger.log(step_metrics(step), step)
    # flushed every step: a killed run keeps its curves
    scalars, _ = tensorboard_events(run_dir / "tensorboard")
    assert scalars["critic/score/mean"].keys() == {1, 2, 3}
    logger.close()

    scalars, texts = tensorboard_events(run_dir / "tensorboard")
    assert scalars["critic/score/mean"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})  # float32
    assert scalars["val-core/plugrl/arithmetic/acc/mean@1"][2] == 0.5
    assert scalars["response_length/mean"] == {1: 2.0, 2: 4.0, 3: 6.0}
    assert scalars["timing_s/step"][1] == 0.5 and scalars["actor/clipped"][1] == 1.0
    assert scalars["perf/total_num_tokens"][3] == 300.0
    assert all(math.isnan(v) for v in scalars["actor/pg_loss"].values())
    assert all(v == math.inf for v in scalars["actor/grad_norm"].values())
    assert "note" not in scalars
    assert "project_name: plugrl-tests" in texts["recipe/text_summary"]
    assert list(offline_trackers.iterdir()) == []  # nothing outside the run folder


def test_a_resumed_run_appends_and_tensorboard_drops_the_redone_steps(run_dir):
    first = make_logger("tensorboard", run_dir)
    for step in (1, 2, 3, 4):
        first.log({"critic/score/mean": step}, step)
    first.close()
    # the run is killed after step 4 and resumes from the checkpoint of step 2
    resumed = make_logger("tensorboard", run_dir)
    for step in (3, 4, 5):
        resumed.log({"critic/score/mean": 10 * step}, step)
    resumed.close()

    scalars, _ = tensorboard_events(run_dir / "tensorboard")
    assert scalars["critic/score/mean"] == {1: 1, 2: 2, 3: 30, 4: 40, 5: 50}
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_tensorboard_dir_is_honoured(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    logger = make_logger("tensorboard", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert tensorboard_events(tmp_path / "tb")[0]["critic/score/mean"] == {1: 0.5}
    assert not (run_dir / "tensorboard").exists()


def test_close_without_a_step_writes_nothing(run_dir):
    make_logger("tensorboard", run_dir).close()
    assert not (run_dir / "tensorboard").exists()
