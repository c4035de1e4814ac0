import logging
import math
import os
import sys

import pytest

from plugrl.errors import PluginError
from plugrl_mlflow.logger import mlflow_key
from tests.plugins.loggers.trackers_testlib import (
    EXPERIMENT,
    PROJECT,
    make_logger,
    mark_checkpoint,
    mlflow_client,
    mlflow_history,
    recipe,
    step_metrics,
)


def run_id_of(run_dir):
    return (run_dir / "mlflow_run_id.txt").read_text().strip()


def test_a_run_in_the_run_folder_with_the_recipe_as_params(run_dir, offline_trackers):
    logger = make_logger("mlflow", run_dir)
    for step in (1, 2, 3):
        logger.log(step_metrics(step), step)
    logger.close()

    client = mlflow_client(run_dir)
    run = client.get_run(run_id_of(run_dir))
    assert client.get_experiment(run.info.experiment_id).name == PROJECT
    assert run.info.run_name == EXPERIMENT and run.info.status == "FINISHED"
    assert run.data.params["actor.optim.lr"] == "1e-06"
    assert run.data.params["trainer.logger"] == '["console", "jsonl"]'
    assert run.data.params["trainer.project_name"] == PROJECT
    assert mlflow_history(client, run.info.run_id, "critic/score/mean") == {1: 0.1, 2: 0.2, 3: 0.3}
    # verl's name for the same metric in MLflow, which refuses "@"
    assert mlflow_history(client, run.info.run_id, "val-core/plugrl/arithmetic/acc/mean_at_1") == {
        1: 0.25,
        2: 0.5,
        3: 0.75,
    }
    losses = mlflow_history(client, run.info.run_id, "actor/pg_loss")
    assert len(losses) == 3 and all(math.isnan(v) for v in losses.values())
    # the SQL store keeps infinity as the largest float
    assert mlflow_history(client, run.info.run_id, "actor/grad_norm")[1] >= sys.float_info.max
    assert mlflow_history(client, run.info.run_id, "actor/clipped") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert "note" not in run.data.metrics
    assert list(offline_trackers.iterdir()) == []  # nothing in the working directory


def test_a_resumed_run_continues_the_same_mlflow_run(run_dir, caplog):
    first = make_logger("mlflow", run_dir)
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step}, step)
    first.close("failed", "RuntimeError: killed after step 3")
    run_id = run_id_of(run_dir)
    assert mlflow_client(run_dir).get_run(run_id).info.status == "FAILED"

    mark_checkpoint(run_dir, 2)
    with caplog.at_level(logging.WARNING, logger="plugrl.loggers"):
        resumed = make_logger("mlflow", run_dir, recipe(total_training_steps=4))
    assert "keeps its earlier values of trainer.total_training_steps" in caplog.text
    assert mlflow_client(run_dir).get_run(run_id).info.status == "RUNNING"
    for step in (3, 4):
        resumed.log({"critic/score/mean": 10 * step}, step)
    resumed.close()

    client = mlflow_client(run_dir)
    assert run_id_of(run_dir) == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])) == 1
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 1), (2, 2), (3, 3), (3, 30), (4, 40)]
    assert client.get_run(run_id).data.params["trainer.total_training_steps"] == "null"


def test_a_run_that_starts_over_gets_a_new_mlflow_run(run_dir):
    ids = []
    make_logger("mlflow", run_dir).close()
    ids.append(run_id_of(run_dir))
    make_logger("mlflow", run_dir).close()  # no checkpoint to resume from
    ids.append(run_id_of(run_dir))
    mark_checkpoint(run_dir, 2)
    make_logger("mlflow", run_dir, recipe(resume_mode="disable")).close()
    ids.append(run_id_of(run_dir))
    assert len(set(ids)) == 3


def test_interrupted_run_ends_killed(run_dir):
    logger = make_logger("mlflow", run_dir)
    logger.close("interrupted")
    assert mlflow_client(run_dir).get_run(run_id_of(run_dir)).info.status == "KILLED"


def test_mlflow_tracking_uri_is_honoured(run_dir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    logger = make_logger("mlflow", run_dir)
    logger.log({"critic/score/mean": 0.5}, 1)
    logger.close()
    assert not (run_dir / "mlflow.db").exists()
    (metric,) = MlflowClient(uri).get_metric_history(run_id_of(run_dir), "critic/score/mean")
    assert metric.value == 0.5


def test_without_sqlalchemy_the_default_store_says_what_to_install(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    with pytest.raises(PluginError) as error:
        make_logger("mlflow", run_dir)
    assert str(error.value) == (
        f"the mlflow logger's store sqlite:///{(run_dir / 'mlflow.db').resolve()} needs "
        "sqlalchemy (pip install 'plugrl[mlflow]'), or set MLFLOW_TRACKING_URI to a tracking "
        "server"
    )


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("val-core/gsm8k/acc/mean@4", "val-core/gsm8k/acc/mean_at_4"),
        ("timing_s/step", "timing_s/step"),
        ("a//b/", "a/b"),
        ("odd(name)", "odd_name_"),
    ],
)
def test_metric_names_mlflow_accepts(name, key):
    assert mlflow_key(name) == key


def test_the_local_store_keeps_mlflow_telemetry_off_unless_the_user_chose(run_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY")
    monkeypatch.delenv("DO_NOT_TRACK", raising=False)
    make_logger("mlflow", run_dir).close()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    make_logger("mlflow", run_dir).close()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"
