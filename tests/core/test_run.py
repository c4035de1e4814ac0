import json
import os
import time

import pytest

import plugrl
from plugrl.cluster.worker import prepare_backend_once
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.device import resolve_device_name
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe
from plugrl.run.runner import run_recipe
from tests.fake_parts import BASE_RECIPE


class Observer:
    def __init__(self):
        self.calls = []

    @plugrl.hookimpl
    def on_run_start(self, recipe, run_dir):
        self.calls.append(("start", recipe.scheduler.steps, run_dir.name))

    @plugrl.hookimpl
    def on_step_end(self, step, metrics):
        self.calls.append(("step", step, metrics["critic/score/mean"]))

    @plugrl.hookimpl
    def on_run_end(self, status, metrics):
        self.calls.append(("end", status, dict(metrics)))


def counting_run(sim_task, tmp_path):
    """The counting scheduler of tests.fake_parts on the simulated parts, two steps."""
    from plugrl_sim.parts import sim_recipe

    data = sim_recipe(sim_task, tmp_path / "run", scheduler="fakescheduler", steps=2)
    data["scheduler"]["steps"] = 2
    data["trainer"]["save_freq"] = 1
    return build_recipe(data, get_plugin_manager())


def test_run_hands_parts_to_the_scheduler_and_reports_to_observers(
    sim_task, tmp_path, fake_parts_manager, plugrl_register_plugin
):
    observer = Observer()
    plugrl_register_plugin(observer, "observer")
    metrics = run_recipe(counting_run(sim_task, tmp_path), get_plugin_manager())
    assert metrics["critic/score/mean"] == 0.2
    assert observer.calls[:3] == [("start", 2, "run"), ("step", 1, 0.1), ("step", 2, 0.2)]
    (_, status, last), *others = observer.calls[3:]
    assert (status, last["critic/score/mean"], others) == ("completed", 0.2, [])
    assert last["perf/wall_clock_s"] > 0  # the core's loop adds the run's clock
    assert 0.01 < last["perf/driver_rss_gb"] < 64  # and this process's resident memory
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    # the resolved recipe is saved and can be read back, and each step was checkpointed
    assert "fakescheduler" in (tmp_path / "run" / "recipe.yaml").read_text()
    assert (tmp_path / "run" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_a_failing_scheduler_still_ends_the_run(
    sim_task, tmp_path, fake_parts_manager, plugrl_register_plugin, monkeypatch
):
    from tests import fake_parts

    def explode(self, parts, step):
        if step == 2:
            raise RuntimeError("scheduler broke")
        return {"critic/score/mean": 0.5}

    monkeypatch.setattr(fake_parts.CountingScheduler, "train_step", explode)
    observer = Observer()
    plugrl_register_plugin(observer, "observer")
    with pytest.raises(RuntimeError, match="scheduler broke"):
        run_recipe(counting_run(sim_task, tmp_path), get_plugin_manager())
    (_, status, last) = observer.calls[-1]
    assert (status, last["critic/score/mean"]) == ("failed", 0.5)


def test_detect_device_asks_plugins_first_and_cpu_last(fake_parts_manager, plugrl_register_plugin):
    recipe = build_recipe({**BASE_RECIPE, "device": "auto"}, get_plugin_manager())
    expected = (
        "cuda" if fake_parts_manager.registry("devices").load("cuda").is_available() else "cpu"
    )
    assert resolve_device_name(recipe, fake_parts_manager) == expected

    class Accelerator:
        @plugrl.hookimpl(tryfirst=True)
        def detect_device(self):
            return "xpu"

    plugrl_register_plugin(Accelerator(), "xpu-detector")
    assert resolve_device_name(recipe, fake_parts_manager) == "xpu"


def test_no_device_detected(plugrl_make_plugin_manager, plugrl_register_plugin):
    import plugrl_console
    import plugrl_jsonl
    from tests import fake_parts

    manager = plugrl_make_plugin_manager(entry_points=[])  # no installed plugin at all
    manager.register(fake_parts, "fake-parts")
    for logger_plugin in (plugrl_console, plugrl_jsonl):  # the recipe's default loggers
        manager.register(logger_plugin)
    recipe = build_recipe({**BASE_RECIPE, "device": "auto"}, manager)
    with pytest.raises(PluginError, match=r"device.name is 'auto' but no plugin detected a device"):
        resolve_device_name(recipe, manager)


def test_unavailable_device_is_a_recipe_error(tmp_path, fake_parts_manager):
    if fake_parts_manager.registry("devices").load("cuda").is_available():
        pytest.skip("this machine has a GPU")
    recipe = build_recipe(
        {**BASE_RECIPE, "device": "cuda", "trainer": {"default_local_dir": str(tmp_path)}},
        get_plugin_manager(),
    )
    with pytest.raises(
        RecipeError,
        match=r"device.name: device 'cuda' is not available on this "
        r"machine \(no hardware or driver\); use device.name=cpu or auto",
    ):
        run_recipe(recipe, get_plugin_manager())


def test_prepare_backend_runs_before_the_backend_with_resolved_names(
    fake_parts_manager, plugrl_register_plugin
):
    seen = []

    class Patcher:
        @plugrl.hookimpl
        def prepare_backend(self, device, backend, recipe):
            seen.append((device, backend, recipe.actor.ppo_epochs))

    plugrl_register_plugin(Patcher(), "patcher")
    recipe = build_recipe(
        {**BASE_RECIPE, "actor": {**BASE_RECIPE["actor"], "ppo_epochs": 2}}, get_plugin_manager()
    )
    prepare_backend_once(fake_parts_manager, "cpu", recipe.actor.backend, recipe)
    prepare_backend_once(fake_parts_manager, "cpu", recipe.actor.backend, recipe)
    assert seen == [("cpu", "fakebackend", 2)]  # once per process


class AllocatorDevice:
    name = "fakegpu"

    @classmethod
    def worker_env(cls, kind):
        return {f"FAKE_{kind.upper()}_CONF": "on", "FAKE_SHARED_CONF": kind}


def test_a_run_in_one_process_takes_the_device_environment_the_user_did_not_set(monkeypatch):
    from plugrl.recipe import Recipe
    from plugrl.run.runner import apply_device_env

    for name in ("FAKE_TRAINER_CONF", "FAKE_ROLLOUT_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_SHARED_CONF", "mine")
    apply_device_env(AllocatorDevice, Recipe())
    assert os.environ["FAKE_TRAINER_CONF"] == "on" and os.environ["FAKE_ROLLOUT_CONF"] == "on"
    assert os.environ["FAKE_SHARED_CONF"] == "mine"


def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    from plugrl.run.folder import prepare_run_dir

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    recipe = build_recipe(
        {"trainer": {"default_local_dir": str(blocker / "run")}}, get_plugin_manager()
    )
    with pytest.raises(RecipeError) as info:
        prepare_run_dir(recipe)
    assert str(info.value) == (
        f"trainer.default_local_dir: cannot create the run folder {blocker / 'run'} (Not a "
        "directory); choose a folder you can write to"
    )


def test_a_model_folder_without_a_model_or_tokenizer_is_one_line(tmp_path):
    from plugrl.run.folder import check_model_folders

    folder = tmp_path / "model"
    folder.mkdir()
    recipe = build_recipe({"model": {"path": str(folder)}}, get_plugin_manager())
    with pytest.raises(RecipeError) as info:
        check_model_folders(recipe)
    assert str(info.value) == (
        f"model.path: {folder} holds no Hugging Face model (none of config.json); point it "
        "at a folder that save_pretrained wrote"
    )
    (folder / "config.json").write_text("{}")
    with pytest.raises(RecipeError) as info:
        check_model_folders(recipe)
    assert "holds no tokenizer (none of tokenizer.json" in str(info.value)
    (folder / "tokenizer.json").write_text("{}")
    check_model_folders(recipe)


def test_each_segment_of_a_run_keeps_its_recipe_and_changes_are_named(tmp_path, caplog):
    import logging

    from plugrl.run.folder import record_recipe

    actor = {"ppo_mini_batch_size": 8}
    first = build_recipe({"data": {"train_batch_size": 8}, "actor": actor}, get_plugin_manager())
    assert record_recipe(first, tmp_path) == tmp_path / "recipe.yaml"
    # the same recipe again (a plain resume) writes nothing
    assert record_recipe(first, tmp_path) == tmp_path / "recipe.yaml"
    second = build_recipe({"data": {"train_batch_size": 16}, "actor": actor}, get_plugin_manager())
    with caplog.at_level(logging.WARNING, logger="plugrl.run"):
        # no checkpoint to continue: a fresh start, another experiment is no news
        assert record_recipe(second, tmp_path) == tmp_path / "recipe.2.yaml"
    assert caplog.messages == []
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3\n")
    trainer = {"resume_mode": str(tmp_path / "global_step_3")}
    third = build_recipe(
        {"data": {"train_batch_size": 24}, "actor": actor, "trainer": trainer}, get_plugin_manager()
    )
    with caplog.at_level(logging.WARNING, logger="plugrl.run"):
        assert record_recipe(third, tmp_path) == tmp_path / "recipe.3.yaml"
    assert (tmp_path / "recipe.yaml").read_text() == first.to_yaml()
    assert (tmp_path / "recipe.2.yaml").read_text() == second.to_yaml()
    assert (tmp_path / "recipe.3.yaml").read_text() == third.to_yaml()
    assert caplog.messages == [
        f"this run continues {tmp_path} with a recipe that differs in data.train_batch_size "
        "16 -> 24: the steps before and after are not one experiment"
    ]


def test_sigterm_stops_the_cli_as_ctrl_c_does():
    import signal

    from plugrl_tools.cli import _stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    try:
        _stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives before this ends
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_dead_ray_actor_is_one_line():
    from plugrl.cluster.ray_group import actor_death_message

    report = (
        "The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: BackendWorker\n\tactor_id: 1a2b\n\tpid: 4242\n"
        "The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
        "code 2."
    )
    assert actor_death_message("a actor rank", RuntimeError(report)) == (
        "a actor rank's Ray actor died (The actor is dead because its worker process has died. "
        "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2.); its output is in Ray's worker logs (`ray logs` lists them), "
        "often an out-of-memory kill"
    )


def test_resident_memory_follows_what_the_process_holds():
    """Resident memory now, not the peak: it goes down when memory is given back."""
    from plugrl.run.metrics import resident_memory_gb

    before = resident_memory_gb()
    block = bytearray(512 * 1024**2)  # touched page by page: resident
    block[::4096] = b"x" * len(range(0, len(block), 4096))
    held = resident_memory_gb()
    del block
    after = resident_memory_gb()
    assert held - before > 0.4
    assert held - after > 0.4
