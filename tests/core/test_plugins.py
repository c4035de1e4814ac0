import logging
import types

import pytest

import plugrl
from plugrl.errors import PluginError
from plugrl.plugin.manager import PluginManager, get_plugin_manager, set_plugin_manager


def plugin_module(name: str, **hooks) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        function.__name__ = hook_name
        setattr(module, hook_name, plugrl.hookimpl(function))
    return module


def registers_reward(name):
    return plugin_module(
        f"plugin_{name}",
        register_reward_functions=lambda register: register(name, "os.path:join"),
    )


def test_builtins_are_entry_points_of_the_core_distribution(plugrl_plugin_manager):
    rows = {row["name"]: row for row in plugrl_plugin_manager.describe()}
    assert {"cpu", "cuda", "console", "sync"} <= set(rows)
    cpu = rows["cpu"]
    assert cpu["distribution"] == "plugrl"
    assert cpu["builtin"] is True
    assert cpu["version"] == plugrl.__version__
    assert cpu["hooks"] == ["detect_device", "register_devices"]
    assert [entry["name"] for entry in cpu["registers"]["devices"]] == ["cpu"]


def test_third_party_entry_point_is_discovered(plugrl_fake_entry_point, plugrl_make_plugin_manager):
    plugrl_fake_entry_point(
        "countdown", registers_reward("countdown"), dist="plugrl-countdown", version="1.2.3"
    )
    manager = plugrl_make_plugin_manager()
    assert "countdown" in manager.registry("reward_functions")
    row = next(r for r in manager.describe() if r["name"] == "countdown")
    assert (row["distribution"], row["version"], row["builtin"]) == (
        "plugrl-countdown",
        "1.2.3",
        False,
    )


def test_broken_import_is_skipped_with_one_warning_line(
    plugrl_fake_entry_point, plugrl_make_plugin_manager, caplog
):
    plugrl_fake_entry_point(
        "broken", "plugrl_test_no_such_module", dist="plugrl-broken", version="0.3"
    )
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        manager = plugrl_make_plugin_manager()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "warning: plugin 'broken' (plugrl_test_no_such_module, from plugrl-broken 0.3) skipped: "
        "ModuleNotFoundError: No module named 'plugrl_test_no_such_module'"
    ]
    assert "\n" not in messages[0]
    assert [f.name for f in manager.failures] == ["broken"]
    # the rest keeps working
    assert "cpu" in manager.registry("devices")
    failed = [r for r in manager.describe(include_all=True) if r["status"] == "failed"]
    assert failed[0]["name"] == "broken"


def test_strict_mode_reraises(plugrl_fake_entry_point, plugrl_make_plugin_manager):
    plugrl_fake_entry_point("broken", "plugrl_test_no_such_module", dist="plugrl-broken")
    with pytest.raises(PluginError, match=r"plugin 'broken' .* failed: ModuleNotFoundError"):
        plugrl_make_plugin_manager(environ={"PLUGRL_STRICT_PLUGINS": "1"})


def test_disable_autoload_keeps_only_builtins(plugrl_fake_entry_point, plugrl_make_plugin_manager):
    plugrl_fake_entry_point("third", registers_reward("third"), dist="plugrl-third")
    manager = plugrl_make_plugin_manager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    names = {row["name"] for row in manager.describe()}
    assert "third" not in names and "cpu" in names


def test_load_plugins_is_an_allow_list(plugrl_fake_entry_point, plugrl_make_plugin_manager, caplog):
    plugrl_fake_entry_point("one", registers_reward("one"), dist="plugrl-one")
    plugrl_fake_entry_point("two", registers_reward("two"), dist="plugrl-two")
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        manager = plugrl_make_plugin_manager(
            environ={
                "PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PLUGRL_LOAD_PLUGINS": "plugrl-two,nothere",
            }
        )
    names = manager.registry("reward_functions").names()
    assert "two" in names and "one" not in names
    assert "PLUGRL_LOAD_PLUGINS names 'nothere', but no installed plugin has that name" in (
        caplog.text
    )


def test_disabled_plugins_block_builtins_too(plugrl_make_plugin_manager):
    manager = plugrl_make_plugin_manager(environ={"PLUGRL_DISABLED_PLUGINS": "cuda,npu"})
    assert manager.registry("devices").names() == ["cpu"]
    disabled = [r for r in manager.describe(include_all=True) if r["status"] == "disabled"]
    assert [r["name"] for r in disabled] == ["cuda", "npu"]


def test_unknown_hook_name_is_reported(plugrl_plugin_manager, caplog):
    typo = plugin_module("typo", register_reward_function=lambda register: None)
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        plugrl_plugin_manager.register(typo, "typo")
    hooks = ", ".join(
        name
        for name in sorted(dir(plugrl_plugin_manager.pm.hook))
        if not name.startswith("_") and getattr(plugrl_plugin_manager.pm.hook, name).has_spec()
    )
    warning = (
        f"implements register_reward_function, which plugrl {plugrl.__version__} does not "
        "define: that function is never called; did you mean register_reward_function -> "
        f"register_reward_functions? hooks: {hooks}"
    )
    assert [record.getMessage() for record in caplog.records] == [
        f"warning: plugin 'typo' (in-process, from no distribution) loads, but {warning}"
    ]
    # it loads, and is listed once: loaded, with the warning
    assert plugrl_plugin_manager.failures == []
    rows = [r for r in plugrl_plugin_manager.describe(include_all=True) if r["name"] == "typo"]
    assert [(r["status"], r["warnings"]) for r in rows] == [("loaded", [warning])]


def test_unknown_hook_name_is_an_error_in_strict_mode(plugrl_make_plugin_manager):
    manager = plugrl_make_plugin_manager(environ={"PLUGRL_STRICT_PLUGINS": "1"})
    typo = plugin_module("typo", register_reward_function=lambda register: None)
    with pytest.raises(PluginError) as info:
        manager.register(typo, "typo")
    assert str(info.value).startswith(
        "plugin 'typo' (in-process, from no distribution) failed: implements "
        f"register_reward_function, which plugrl {plugrl.__version__} does not define; did you "
        "mean register_reward_function -> register_reward_functions? hooks: detect_device, "
    )


def test_hook_with_wrong_arguments_is_rejected(plugrl_plugin_manager):
    bad = plugin_module("bad", register_devices=lambda register, extra: None)
    assert plugrl_plugin_manager.register(bad, "bad") is None
    assert plugrl_plugin_manager.failures[-1].name == "bad"
    assert "extra" in plugrl_plugin_manager.failures[-1].error


def test_registration_hook_that_raises_names_the_plugin(
    plugrl_register_plugin, plugrl_plugin_manager
):
    def explode(register):
        raise RuntimeError("boom")

    plugrl_register_plugin(plugin_module("exploding", register_loggers=explode), "exploding")
    with pytest.raises(
        PluginError,
        match=r"plugin 'exploding' failed in register_loggers: "
        r"RuntimeError: boom",
    ):
        plugrl_plugin_manager.registry("loggers")


def test_duplicate_across_plugins_names_both(plugrl_register_plugin, plugrl_plugin_manager):
    plugrl_register_plugin(
        plugin_module("mine", register_devices=lambda register: register("cpu", "os:getcwd")),
        "mine",
    )
    with pytest.raises(
        PluginError,
        match=r"device 'cpu' is registered twice: by plugin "
        r"'cpu' and by plugin 'mine'",
    ):
        plugrl_plugin_manager.registry("devices")


def test_registries_follow_register_and_unregister(plugrl_register_plugin, plugrl_plugin_manager):
    assert "mine" not in plugrl_plugin_manager.registry("reward_functions")
    plugrl_register_plugin(registers_reward("mine"), "mine-plugin")
    assert "mine" in plugrl_plugin_manager.registry("reward_functions")
    plugrl_plugin_manager.unregister("mine-plugin")
    assert "mine" not in plugrl_plugin_manager.registry("reward_functions")


def test_global_manager_is_created_once_and_replaceable():
    previous = set_plugin_manager(None)
    try:
        first = get_plugin_manager()
        assert get_plugin_manager() is first
        replacement = PluginManager(environ={})
        assert set_plugin_manager(replacement) is first
        assert get_plugin_manager() is replacement
    finally:
        set_plugin_manager(previous)


def test_register_fixture_undoes_registration(plugrl_register_plugin, plugrl_plugin_manager):
    name = plugrl_register_plugin(registers_reward("temp"), "temp-plugin")
    assert name == "temp-plugin"
    assert plugrl_plugin_manager.pm.has_plugin("temp-plugin")


def test_the_plugins_a_run_cannot_do_without_cannot_be_disabled(plugrl_make_plugin_manager, caplog):
    with caplog.at_level(logging.WARNING, logger="plugrl.plugins"):
        manager = plugrl_make_plugin_manager(
            environ={"PLUGRL_DISABLED_PLUGINS": "cpu,sync,transports,cuda"}
        )
    assert manager.registry("devices").names() == ["cpu", "npu"]
    assert "sync" in manager.registry("schedulers")
    assert "local" in manager.registry("weight_transports")
    assert [r["name"] for r in manager.describe(include_all=True) if r["status"] == "disabled"] == [
        "cuda"
    ]
    assert caplog.messages == [
        "warning: PLUGRL_DISABLED_PLUGINS names plugin 'cpu' (the device every run can fall "
        "back to), which plugrl cannot run without; it stays loaded",
        "warning: PLUGRL_DISABLED_PLUGINS names plugin 'sync' (the default scheduler), which "
        "plugrl cannot run without; it stays loaded",
        "warning: PLUGRL_DISABLED_PLUGINS names plugin 'transports' (how weights reach the "
        "engines), which plugrl cannot run without; it stays loaded",
    ]
    # the whole core distribution disabled: its essential plugins stay
    everything_off = plugrl_make_plugin_manager(environ={"PLUGRL_DISABLED_PLUGINS": "plugrl"})
    assert "cpu" in everything_off.registry("devices")
    assert "fsdp2" not in everything_off.registry("training_backends")
