import pytest

from plugrl.errors import PluginError, UnknownNameError
from plugrl.registry import Registry, import_object


def make_registry() -> Registry:
    registry = Registry("advantage_estimators")
    registry.register("plugin-a", "grpo", "collections:OrderedDict", aliases=["group"])
    registry.register("plugin-a", "rloo", dict)
    return registry


def test_lookup_by_name_and_alias():
    registry = make_registry()
    assert registry.get("group").name == "grpo"
    assert "group" in registry and "grpo" in registry
    assert registry.names() == ["grpo", "rloo"]
    assert registry.names(include_aliases=True) == ["group", "grpo", "rloo"]


def test_string_targets_are_imported_only_on_load(monkeypatch):
    registry = Registry("schedulers")
    registry.register("p", "lazy", "plugrl_no_such_module_xyz:Thing")
    # registering and listing never imports
    assert registry.names() == ["lazy"]
    with pytest.raises(
        PluginError,
        match=r"scheduler 'lazy' from plugin 'p' failed to import "
        r"'plugrl_no_such_module_xyz:Thing': ModuleNotFoundError",
    ):
        registry.load("lazy")
    from collections import OrderedDict

    assert make_registry().load("grpo") is OrderedDict


def test_duplicate_names_the_two_plugins():
    registry = make_registry()
    with pytest.raises(
        PluginError,
        match=r"advantage estimator 'rloo' is registered twice: "
        r"by plugin 'plugin-a' and by plugin 'plugin-b'",
    ):
        registry.register("plugin-b", "rloo", list)
    with pytest.raises(PluginError, match="'group' is registered twice"):
        registry.register("plugin-b", "other", list, aliases=["group"])


def test_unknown_name_suggests_the_closest():
    registry = make_registry()
    with pytest.raises(UnknownNameError) as info:
        registry.get("grpoo")
    assert str(info.value) == (
        "algorithm.adv_estimator: unknown advantage estimator 'grpoo': did you mean 'grpo'? "
        "registered: group, grpo, rloo"
    )


def test_unknown_external_part_says_how_to_install():
    registry = Registry("rollout_engines")
    with pytest.raises(
        UnknownNameError,
        match=r"rollout engine 'vllm' is not installed: "
        r"pip install plugrl-vllm",
    ):
        registry.get("vllm")


def test_missing_requirement_marks_unavailable_with_install_hint():
    registry = Registry("rollout_engines")
    entry = registry.register(
        "p", "fancy", "x:Y", requires=["plugrl_missing_lib_123"], install="pip install missing-lib"
    )
    assert not entry.available
    assert entry.unavailable_reason == "needs plugrl_missing_lib_123 (pip install missing-lib)"
    with pytest.raises(
        PluginError,
        match=r"rollout engine 'fancy' \(plugin 'p'\) is installed "
        r"but cannot run here: it needs plugrl_missing_lib_123",
    ):
        entry.load()
    assert entry.describe()["available"] is False


def test_glob_patterns_match_and_exact_names_win():
    registry = Registry("reward_functions")
    registry.register("p", "aime*", len)
    registry.register("p", "aime2024", abs)
    registry.register("p", "*", repr)
    assert registry.match("aime2024").target is abs
    assert registry.match("aime2025").target is len
    assert registry.match("gsm8k").target is repr
    assert Registry("reward_functions").match("anything") is None


def test_bad_registrations():
    registry = Registry("loggers")
    with pytest.raises(PluginError, match="registered a logger with no name"):
        registry.register("p", "", dict)
    with pytest.raises(PluginError, match="registered logger 'x' as None"):
        registry.register("p", "x", None)
    with pytest.raises(ValueError, match="unknown kind"):
        Registry("widgets")


def test_import_object_paths():
    assert import_object("os.path:join").__name__ == "join"
    with pytest.raises(PluginError, match=r"expected 'package.module:attribute'"):
        import_object("os.path.join")
