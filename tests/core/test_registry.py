import re

import pytest

from plugrl.errors import PluginError, UnknownNameError
from plugrl.plugin.registry import PART_KINDS, Registry, import_object, section_kind
from tests import install_hints as hints


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
        match=re.escape(f"rollout engine 'vllm' is not installed: {hints.VLLM}"),
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


# ------------------------------------------------------------------------ the kinds of part


def test_the_kinds_agree_with_the_recipe_keys_that_choose_them():
    import attrs

    from plugrl.recipe import Recipe

    recipe = Recipe()
    for kind in PART_KINDS.values():
        if kind.name == "reward_functions":
            continue  # chosen by each row's data_source, not by a recipe key
        if kind.name == "judge_parsers":
            continue  # chosen by a key of the judge manager's own reward section
        # a chooser may sit in a nested section (rollout.agent.loop)
        *path, selector = kind.recipe_key.split(".")
        section = recipe
        for name in path:
            section = getattr(section, name)
        fields = attrs.fields_dict(type(section))
        chooser = fields[selector]
        assert chooser.metadata["registry"] == kind.name, kind.recipe_key
        assert (chooser.default == "auto") == kind.accepts_auto, kind.recipe_key
        if kind.section_config is not None:
            assert kind.section_base() is type(section), kind.recipe_key
            assert section_kind(kind.section) is kind
        if kind.args_key is not None:
            *args_path, args_field = kind.args_key.split(".")
            assert args_path == path and args_field in fields, kind.args_key
    assert {k.section for k in PART_KINDS.values() if k.section_config} == {
        "device",
        "actor",
        "rollout",
        "reward",
        "scheduler",
    }
    assert section_kind("trainer") is None


def test_a_kind_not_chosen_by_a_section_has_no_base():
    with pytest.raises(ValueError, match="a policy loss does not own a recipe section"):
        PART_KINDS["policy_losses"].section_base()


def test_the_registry_imports_no_config_class():
    import subprocess
    import sys

    code = (
        "import sys, plugrl.plugin.registry as r; r.PART_KINDS; "
        "print(sorted(m for m in sys.modules if m.startswith('plugrl.parts')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
