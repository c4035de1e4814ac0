"""The six loggers as plugins: registered with what they need, refused with one line when
their library is missing, and closed at the end of a run, also a failed one."""

import os
import subprocess
import sys

import pytest

from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.runner import run_recipe
from tests import fake_parts
from tests.plugins.loggers.trackers_testlib import (
    mlflow_client,
    swanlab_records,
    swanlab_run_folders,
    tensorboard_events,
    wandb_inspect,
    wandb_run_folders,
)

TRACKERS = {
    # logger name: the module it needs, the extra that installs it
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "swanlab": "swanlab",
}


@pytest.fixture
def fake_parts_manager(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(fake_parts, "fake-parts")
    return plugrl_plugin_manager


def test_all_six_are_registered_and_the_trackers_say_what_they_need(plugrl_plugin_manager):
    registry = plugrl_plugin_manager.registry("loggers")
    assert registry.names() == ["console", "jsonl", "mlflow", "swanlab", "tensorboard", "wandb"]
    for name, module in TRACKERS.items():
        entry = registry.get(name)
        assert entry.requires == (module,) and entry.install == f"pip install 'plugrl[{name}]'"
        assert entry.available  # the test extra installs them
        assert entry.describe()["description"]


def test_loggers_import_their_library_only_when_chosen():
    code = (
        "import sys; from plugrl.plugin.manager import get_plugin_manager; "
        "registry = get_plugin_manager().registry('loggers'); "
        "[registry.get(n).describe() for n in registry.names()]; "
        f"print(sorted(m for m in {tuple(TRACKERS.values())} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_a_missing_library_makes_the_logger_unavailable_with_one_line(
    name, plugrl_plugin_manager, monkeypatch
):
    monkeypatch.setitem(sys.modules, TRACKERS[name], None)  # as if not installed
    entry = plugrl_plugin_manager.registry("loggers").get(name)
    assert not entry.available
    assert entry.unavailable_reason == f"needs {TRACKERS[name]} (pip install 'plugrl[{name}]')"
    with pytest.raises(RecipeError) as error:
        build_recipe({"trainer": {"logger": ["console", name]}}, plugrl_plugin_manager)
    assert str(error.value) == (
        f"trainer.logger: logger {name!r} (plugin {name!r}) is installed but cannot run here: "
        "it needs "
        f"{TRACKERS[name]} (pip install 'plugrl[{name}]')"
    )


def test_the_cli_lists_and_refuses_a_logger_whose_library_is_missing(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\nsys.modules.update(dict.fromkeys(['wandb'], None))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hide), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    cli = [sys.executable, "-m", "plugrl_tools.cli"]
    listing = subprocess.run([*cli, "plugins", "--all"], capture_output=True, text=True, env=env)
    assert "wandb [unavailable: needs wandb (pip install 'plugrl[wandb]')]" in listing.stdout
    refused = subprocess.run(
        [*cli, "run", "quickstart", "trainer.logger=[console,wandb]", "--print-config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "Error: trainer.logger: logger 'wandb' (plugin 'wandb') is installed but cannot run "
        "here: it needs wandb (pip install 'plugrl[wandb]')"
    ]


def run_with_trackers(tmp_path, sim_task, steps=2):
    """The counting scheduler of tests.fake_parts (step N scores N / 10) on the simulated
    parts, logging to every tracker."""
    from plugrl_sim.parts import sim_recipe

    data = sim_recipe(sim_task, tmp_path / "run", scheduler="fakescheduler", steps=steps)
    data["scheduler"]["steps"] = steps
    data["trainer"].update(
        project_name="plugrl-tests",
        experiment_name="e2e",
        logger=["console", "jsonl", *sorted(TRACKERS)],
    )
    plugins = get_plugin_manager()
    recipe = build_recipe(data, plugins)
    return recipe, run_recipe(recipe, plugins)


def tracker_outcomes(run_dir):
    """How each tracker recorded the end of the run, and the steps it holds."""
    scalars, _ = tensorboard_events(run_dir / "tensorboard")
    (wandb_folder,) = wandb_run_folders(run_dir)
    wandb_summary = wandb_inspect(wandb_folder, "--summary")
    mlflow_run = mlflow_client(run_dir).get_run((run_dir / "mlflow_run_id.txt").read_text().strip())
    (swanlab_folder,) = swanlab_run_folders(run_dir)
    (finish,) = (r["finish"] for r in swanlab_records(swanlab_folder) if "finish" in r)
    return {
        "tensorboard": sorted(scalars["critic/score/mean"]),
        "wandb": (wandb_summary["state"], wandb_summary["step"]),
        "mlflow": (mlflow_run.info.status, mlflow_run.data.metrics["critic/score/mean"]),
        "swanlab": finish["state"],
    }


def test_a_run_logs_to_every_tracker_and_ends_their_runs(tmp_path, fake_parts_manager, sim_task):
    run_with_trackers(tmp_path, sim_task, steps=2)
    assert tracker_outcomes(tmp_path / "run") == {
        "tensorboard": [1, 2],
        "wandb": ("finished", 2),
        "mlflow": ("FINISHED", 0.2),
        "swanlab": "RUN_STATE_FINISHED",
    }


def test_a_failed_run_ends_every_tracker_run_as_failed(
    tmp_path, fake_parts_manager, monkeypatch, sim_task
):
    def explode(self, parts, step):
        if step == 2:
            raise RuntimeError("scheduler broke")
        return {"critic/score/mean": 0.5}

    monkeypatch.setattr(fake_parts.CountingScheduler, "train_step", explode)
    with pytest.raises(RuntimeError, match="scheduler broke"):
        run_with_trackers(tmp_path, sim_task)
    assert tracker_outcomes(tmp_path / "run") == {
        "tensorboard": [1],
        "wandb": ("failed", 1),
        "mlflow": ("FAILED", 0.5),
        "swanlab": "RUN_STATE_CRASHED",
    }
