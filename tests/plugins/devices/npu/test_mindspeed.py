"""MindSpeed patching in prepare_backend(npu, megatron), against fake MindSpeed and Megatron
packages (fake_ascend.py): import order, the repatch call and its arguments, and every way the
patches can fail to apply stopping the run or showing in the log."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

import plugrl
import plugrl_npu
from plugrl.cluster.worker import prepare_backend_once
from plugrl.errors import PluginError
from plugrl_npu.mindspeed import apply_mindspeed, repatch_arguments
from tests.plugins.devices.npu import fake_ascend


@pytest.fixture
def mindspeed(tmp_path, monkeypatch):
    """The fake packages on the path, torch_npu faked; their modules forgotten afterwards (and
    a real megatron that an earlier test imported put back)."""
    for name in list(sys.modules):
        if name.split(".")[0] in {"mindspeed", "megatron"}:
            monkeypatch.delitem(sys.modules, name)
    fake_ascend.install_torch_npu(monkeypatch)
    monkeypatch.syspath_prepend(str(fake_ascend.write_mindspeed(tmp_path)))
    monkeypatch.setattr(sys, "argv", ["ray::TrainerWorker", "--node-ip-address=10.0.0.1"])
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in {"mindspeed", "megatron"}:
            del sys.modules[name]


def recipe(override=None, **actor):
    return SimpleNamespace(
        actor=SimpleNamespace(override_transformer_config=override or {}, **actor),
        device=SimpleNamespace(name="npu"),
    )


def adaptor():
    return sys.modules["mindspeed.megatron_adaptor"]


def test_repatch_arguments_come_from_override_transformer_config():
    assert repatch_arguments(recipe({"use_flash_attn": False, "apply_rope_fusion": True})) == {
        "use_flash_attn": False,
        "apply_rope_fusion": True,
    }
    assert repatch_arguments(recipe(context_parallel_size=4)) == {
        "use_flash_attn": True,
        "context_parallel_size": 4,
    }
    assert repatch_arguments(recipe(context_parallel_size=1)) == {"use_flash_attn": True}
    # verl's layout, actor.megatron.*
    nested = SimpleNamespace(
        actor=SimpleNamespace(
            megatron={"override_transformer_config": {"x": 1}, "context_parallel_size": 2}
        )
    )
    assert repatch_arguments(nested) == {"x": 1, "use_flash_attn": True, "context_parallel_size": 2}


def test_the_adaptor_is_imported_before_megatron_and_repatched_with_the_recipe(mindspeed):
    lines = apply_mindspeed(recipe({"apply_rope_fusion": True}, context_parallel_size=2))
    seen = adaptor().SEEN
    assert seen["megatron_first"] is False
    assert seen["argv"] == ["ray::TrainerWorker"]  # not Ray's flags
    assert sys.argv == ["ray::TrainerWorker", "--node-ip-address=10.0.0.1"]
    wanted = {"apply_rope_fusion": True, "use_flash_attn": True, "context_parallel_size": 2}
    assert [wanted] == adaptor().REPATCH_CALLS
    from megatron.core import parallel_state

    assert parallel_state.initialize_model_parallel() == "mindspeed"
    assert lines == [
        "mindspeed.megatron_adaptor imported before megatron (MindSpeed 0.12.1.fake)",
        "repatch(apply_rope_fusion=True, context_parallel_size=2, use_flash_attn=True)",
        "1 MindSpeed patches applied: megatron.core.parallel_state.initialize_model_parallel",
    ]


def test_megatron_imported_first_is_an_error(mindspeed):
    import megatron.core  # noqa: F401

    with pytest.raises(PluginError, match="megatron was imported in this process before"):
        apply_mindspeed(recipe())
    assert "mindspeed.megatron_adaptor" not in sys.modules


def test_a_repatch_that_drops_the_patches_stops_the_run(mindspeed, monkeypatch):
    monkeypatch.setenv("FAKE_MINDSPEED_REPATCH", "drops")
    with pytest.raises(
        PluginError,
        match=r"MindSpeed applied no patch to Megatron after repatch\(use_flash_attn=True\) "
        r"\(1 registered, none applied\)",
    ):
        apply_mindspeed(recipe())


def test_a_repatch_that_ignores_the_recipe_stops_the_run(mindspeed, monkeypatch):
    monkeypatch.setenv("FAKE_MINDSPEED_REPATCH", "ignores-args")
    with pytest.raises(
        PluginError,
        match=r"do not hold actor.override_transformer_config: "
        r"apply_rope_fusion=True \(has '<missing>'\)",
    ):
        apply_mindspeed(recipe({"apply_rope_fusion": True}))


def test_patches_left_unapplied_are_a_warning_and_a_log_line(mindspeed, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_MINDSPEED_REPATCH", "one-idle")
    with caplog.at_level(logging.WARNING, logger="plugrl.npu"):
        lines = apply_mindspeed(recipe())
    assert lines[-1] == (
        "1 MindSpeed patches registered but NOT applied: megatron.core.parallel_state.unused"
    )
    assert "NOT applied after repatch: megatron.core.parallel_state.unused" in caplog.text


def test_without_mindspeed_megatron_on_npu_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mindspeed", None)
    with pytest.raises(PluginError, match="needs MindSpeed: install MindSpeed from Ascend's"):
        apply_mindspeed(recipe())


class StandInMegatron:
    """Registers a ``megatron`` backend name, as plugrl-megatron does, so the core's prepare
    step can be exercised here."""

    @plugrl.hookimpl
    def register_training_backends(self, register):
        register("megatron", "plugrl.parts.backend:TrainingBackend", framework_modules=["megatron"])


def test_the_core_runs_the_patching_once_and_logs_each_line(
    mindspeed, plugrl_register_plugin, plugrl_plugin_manager, caplog
):
    plugrl_register_plugin(plugrl_npu)
    if "megatron" not in plugrl_plugin_manager.registry("training_backends"):
        # plugrl-megatron is not installed here
        plugrl_register_plugin(StandInMegatron(), name="stand-in-megatron")
    run = recipe({"apply_rope_fusion": True})
    with caplog.at_level(logging.INFO, logger="plugrl.cluster"):
        patched = prepare_backend_once(plugrl_plugin_manager, "npu", "megatron", run)
        again = prepare_backend_once(plugrl_plugin_manager, "npu", "megatron", run)
    assert again is patched and len(adaptor().REPATCH_CALLS) == 1
    plugin = patched[0].split(":")[0]  # "npu", or the module's name when registered here
    assert patched[0] == (
        f"{plugin}: mindspeed.megatron_adaptor imported before megatron (MindSpeed 0.12.1.fake)"
    )
    assert f"prepare_backend(npu, megatron) by {plugin}: repatch(apply_rope_fusion=True" in (
        caplog.text
    )


def test_other_devices_and_backends_are_left_alone(mindspeed):
    assert plugrl_npu.prepare_backend("cuda", "megatron", recipe()) is None
    assert plugrl_npu.prepare_backend("npu", "other", recipe()) is None
    assert "mindspeed.megatron_adaptor" not in sys.modules
