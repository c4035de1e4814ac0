import pytest

TRACKER_VARIABLES = [
    "TENSORBOARD_DIR",
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_RUN_ID",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "SWANLAB_MODE",
    "SWANLAB_LOG_DIR",
    "SWANLAB_API_KEY",
]


@pytest.fixture(autouse=True)
def offline_trackers(tmp_path, monkeypatch):
    """Each test in an empty working directory, with the trackers' own settings and caches
    in it and none of the user's variables; the trackers' usage telemetry off (nothing here
    may reach a host)."""
    for name in TRACKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "tracker-home"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))
    monkeypatch.setenv("SWANLAB_ROOT", str(home / "swanlab"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "runs" / "plugrl-tests" / "grpo-tiny"
