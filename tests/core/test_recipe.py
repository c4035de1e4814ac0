import os

import pytest
import yaml

from plugrl.errors import PluginError, RecipeError, UnknownNameError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import (
    Recipe,
    apply_overrides,
    build_recipe,
    compose_file,
    explain,
    load_recipe,
    parse_override,
    part_args,
)
from tests import install_hints as hints
from tests.fake_parts import BASE_RECIPE, FakeEngineConfig


@pytest.fixture
def base(write_recipe, fake_parts_manager):
    return write_recipe(BASE_RECIPE, "base.yaml")


def load(path, *overrides):
    return load_recipe(path, overrides, get_plugin_manager())


def error_of(path, *overrides) -> str:
    with pytest.raises(RecipeError) as info:
        load(path, *overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ composition and overrides


def test_defaults_compose_and_the_file_wins(base, write_recipe):
    path = write_recipe(
        {"defaults": ["base.yaml"], "actor": {"ppo_epochs": 3}, "trainer": {"total_epochs": 5}}
    )
    recipe = load(path)
    assert recipe.actor.ppo_epochs == 3
    assert recipe.actor.backend == "fakebackend"  # from the default
    assert recipe.trainer.total_epochs == 5


def test_nested_defaults_and_merge_order(base, write_recipe):
    write_recipe(
        {"defaults": ["base.yaml"], "actor": {"ppo_epochs": 2, "optim": {"lr": 1e-5}}},
        "middle.yaml",
    )
    path = write_recipe({"defaults": "middle.yaml", "actor": {"optim": {"weight_decay": 0.0}}})
    recipe = load(path)
    assert (recipe.actor.ppo_epochs, recipe.actor.optim.lr, recipe.actor.optim.weight_decay) == (
        2,
        1e-5,
        0.0,
    )


def test_a_shipped_recipe_is_a_default_by_name(tmp_path):
    from plugrl.plugin.manager import PluginManager

    path = tmp_path / "mine.yaml"
    path.write_text(
        "defaults: [quickstart]\ntrainer: {total_training_steps: 5, default_local_dir: runs/mine}\n"
    )
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    recipe = load_recipe(path, (), manager)
    assert recipe.trainer.total_training_steps == 5
    assert recipe.trainer.test_freq == 5  # from the shipped quickstart recipe
    assert recipe.rollout.n == 8


def test_a_shipped_recipe_with_dots_in_its_name_is_a_default_by_name(tmp_path):
    from plugrl.plugin.manager import PluginManager

    path = tmp_path / "mine.yaml"
    path.write_text("defaults: [gsm8k-grpo-qwen2.5-0.5b]\nrollout: {n: 4}\n")
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    recipe = load_recipe(path, (), manager)
    assert recipe.rollout.n == 4
    assert recipe.data.max_response_length == 3072  # from the shipped GSM8K recipe


def test_an_override_can_empty_a_mapping_or_restore_a_default(base, write_recipe):
    path = write_recipe(
        {
            "defaults": ["base.yaml"],
            "model": {"override_config": {"attention_dropout": 0.0, "rope_theta": 10.0}},
            "actor": {"ppo_epochs": 3},
        }
    )
    assert load(path).model.override_config == {"attention_dropout": 0.0, "rope_theta": 10.0}
    # merging {} would change nothing: KEY={} empties the mapping
    assert load(path, "model.override_config={}").model.override_config == {}
    # ~KEY removes what the files set, so the key takes its default again
    assert load(path, "~actor.ppo_epochs").actor.ppo_epochs == 1
    assert load(path, "~model.override_config").model.override_config == {}
    assert load(path, "~trainer.seed").trainer.seed == 42  # not set: nothing to remove
    assert error_of(path, "~") == "override '~' is not ~KEY (for example ~model.override_config)"


def test_defaults_cycle_is_an_error(write_recipe):
    write_recipe({"defaults": ["b.yaml"]}, "a.yaml")
    path = write_recipe({"defaults": ["a.yaml"]}, "b.yaml")
    with pytest.raises(
        RecipeError,
        match=r"recipe defaults form a cycle: b.yaml -> a.yaml -> "
        r"b.yaml",
    ):
        compose_file(path)


def test_overrides_are_typed_by_the_field(base):
    recipe = load(
        base,
        "actor.optim.lr=1e-6",
        "data.train_batch_size=64",
        "actor.ppo_mini_batch_size=32",
        "actor.shuffle=true",
        "trainer.logger=[console]",
        "data.train_files=one.parquet",
        "actor.clip_ratio_high=0.28",
        "trainer.total_training_steps=null",
    )
    assert recipe.actor.optim.lr == 1e-6 and isinstance(recipe.actor.optim.lr, float)
    assert recipe.data.train_batch_size == 64
    assert recipe.actor.shuffle is True
    assert recipe.trainer.logger == ["console"]
    # a single path is a list of one, taken from the working folder
    assert recipe.data.train_files == [os.path.join(os.getcwd(), "one.parquet")]
    assert recipe.actor.effective_clip_high == 0.28 and recipe.actor.effective_clip_low == 0.2
    assert recipe.trainer.total_training_steps is None


def test_shorthand_sections(base):
    recipe = load(base, "cluster=ray", "device=cpu")
    assert recipe.cluster.mode == "ray" and recipe.device.name == "cpu"
    # an override into a section given in short form keeps the short form's value
    raw = apply_overrides({"cluster": "ray"}, ["cluster.address=auto"])
    assert raw["cluster"] == {"mode": "ray", "address": "auto"}


def test_plugin_section_uses_the_chosen_plugins_config_class(base):
    recipe = load(base, "rollout.engine_option=3", "rollout.n=4")
    assert isinstance(recipe.rollout, FakeEngineConfig)
    assert (recipe.rollout.engine_option, recipe.rollout.n) == (3, 4)


def test_print_config_round_trips(base, write_recipe):
    recipe = load(base, "rollout.n=8", "actor.optim.lr=3e-6")
    again = load(write_recipe(recipe.to_yaml(), "resolved.yaml"))
    assert again == recipe
    assert yaml.safe_load(recipe.to_yaml())["rollout"]["engine_option"] == 7


def test_a_recipe_with_no_file_is_all_defaults(fake_parts_manager):
    recipe = build_recipe(BASE_RECIPE, get_plugin_manager())
    assert recipe.data.max_prompt_length == 512
    assert recipe.run_dir.as_posix() == "runs/plugrl/run"


def test_part_args_are_validated_and_structured(base):
    recipe = load(
        base,
        "algorithm.adv_estimator=fakeestimator_with_args",
        "algorithm.adv_estimator_args.steps=5",
    )
    assert part_args(recipe, "algorithm", "adv_estimator_args", get_plugin_manager()).steps == 5
    assert error_of(
        base,
        "algorithm.adv_estimator=fakeestimator_with_args",
        "algorithm.adv_estimator_args.stepz=5",
    ) == (
        "algorithm.adv_estimator_args.stepz: unknown key; did you mean "
        "'algorithm.adv_estimator_args.steps'?"
    )
    assert error_of(base, "algorithm.adv_estimator_args.x=1") == (
        "algorithm.adv_estimator_args: 'fakeestimator' takes no options, got x"
    )


# ------------------------------------------------------------------ one-line errors


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor.optim.lrr=1", "actor.optim.lrr: unknown key; did you mean 'actor.optim.lr'?"),
        ("actor.optim.lr=abc", "actor.optim.lr: expected a number, got 'abc'"),
        ("data.train_batch_size=1.5", "data.train_batch_size: expected an integer, got 1.5"),
        ("trainer.total_epochs=true", "trainer.total_epochs: expected an integer, got True"),
        ("actor.shuffle=3", "actor.shuffle: expected true or false, got 3"),
        ("actor.ppo_mini_batch_size=0", "actor.ppo_mini_batch_size: must be > 0, got 0"),
        ("actor.loss_scale_factor=-1", "actor.loss_scale_factor: must be > 0, got -1"),
        (
            "rollout.val_kwargs.top_p=2",
            "rollout.val_kwargs.top_p: must be between 0 and 1, got 2.0",
        ),
        (
            "actor.loss_agg_mode=mean",
            "actor.loss_agg_mode: must be one of token-mean, "
            "token-sum, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm, "
            "got 'mean'",
        ),
        (
            "actor.optim=3",
            "actor.optim: expected a section of keys (lr, weight_decay, betas, "
            "lr_warmup_steps, lr_warmup_steps_ratio, lr_scheduler_type, min_lr_ratio), got 3",
        ),
        (
            "rollout.engine_optionn=1",
            "rollout.engine_optionn: unknown key; did you mean 'rollout.engine_option'?",
        ),
        ("trainr.total_epochs=1", "trainr: unknown key; did you mean 'trainer'?"),
        (
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.lr: unknown "
            "key; 'actor_rollout_ref.actor.optim.lr' is verl's name, plugrl's is 'actor.optim.lr'",
        ),
        (
            "device=tpu",
            "device.name: unknown device 'tpu': did you mean 'npu'? registered: cpu, cuda, npu",
        ),
        (
            "trainer.logger=[console,wandbb]",
            "trainer.logger: unknown logger 'wandbb': did you mean 'wandb'? registered: console, "
            "jsonl, mlflow, swanlab, tensorboard, wandb",
        ),
        (
            "actor.kl_loss_type=fakekk",
            "actor.kl_loss_type: unknown KL penalty 'fakekk': did you "
            "mean 'fakekl'? registered: fakekl",
        ),
        ("scheduler.name=7", "scheduler.name: expected a name, got 7"),
        (
            "scheduler.name=fakescheduller",
            "scheduler.name: unknown scheduler 'fakescheduller': did you mean 'fakescheduler'?",
        ),
    ],
)
def test_recipe_errors_are_one_line_naming_key_and_fix(base, override, message):
    error = error_of(base, override)
    if override.startswith(("trainer.logger", "actor.kl_loss_type", "scheduler.name=f")):
        assert error.startswith(message.split(" registered:")[0])
    else:
        assert error == message


def test_a_part_of_a_distribution_not_installed_names_its_install_command(
    write_recipe, plugrl_make_plugin_manager
):
    plugrl_make_plugin_manager(environ={"PLUGRL_DISABLED_PLUGINS": "vllm"})
    path = write_recipe({})
    assert error_of(path, "rollout.engine=vllm") == (
        f"rollout.engine: rollout engine 'vllm' is not installed: {hints.VLLM}"
    )


def test_unknown_plugin_in_a_plugin_section_is_an_unknown_name_error(base):
    with pytest.raises(UnknownNameError):
        load(base, "actor.backend=no-such-backend")


def test_override_syntax_error():
    with pytest.raises(RecipeError, match=r"override 'actor.optim.lr' is not KEY=VALUE"):
        parse_override("actor.optim.lr")
    with pytest.raises(RecipeError, match="is not KEY=VALUE"):
        parse_override("actor..lr=1")


def test_yaml_file_errors(write_recipe, tmp_path, fake_parts_manager):
    bad = write_recipe("actor:\n  ppo_epochs: [1,\n", "bad.yaml")
    with pytest.raises(RecipeError, match=r"bad.yaml: line \d+, column \d+ is not valid YAML"):
        load(bad)
    with pytest.raises(
        RecipeError,
        match=r"recipe file '.*missing.yaml' not found; check the "
        r"path",
    ):
        load(tmp_path / "missing.yaml")
    listing = write_recipe("- a\n- b\n", "list.yaml")
    with pytest.raises(RecipeError, match="must be a mapping of sections, not a list"):
        load(listing)
    bad_defaults = write_recipe({"defaults": [1]}, "bad_defaults.yaml")
    with pytest.raises(RecipeError, match="defaults: must be a list of recipe file paths"):
        load(bad_defaults)


def test_section_that_is_not_a_mapping(base):
    assert error_of(base, "data=3") == "data: expected a section of keys, got 3"


def test_plugin_config_must_extend_the_base(base):
    with pytest.raises(
        PluginError,
        match=r"registered 'badconfig' with config .*NotAConfig.*, "
        r"which must subclass plugrl.parts.rollout.RolloutConfig",
    ):
        load(base, "rollout.engine=badconfig")


def test_every_core_key_is_documented():
    from plugrl.recipe import iter_options

    for key, field, _value in iter_options(Recipe()):
        assert field.metadata.get("help"), f"{key} has no help text"


# ------------------------------------------------------------------ explain


def test_explain_a_key(fake_parts_manager):
    info = explain("actor.optim.lr", get_plugin_manager())
    assert (info.type, info.default, info.verl) == (
        "float",
        1e-6,
        "actor_rollout_ref.actor.optim.lr",
    )
    assert info.help == "Peak learning rate."


def test_loss_scale_factor_is_verls_key(fake_parts_manager):
    info = explain("actor.loss_scale_factor", get_plugin_manager())
    assert (info.default, info.verl) == (None, "actor_rollout_ref.actor.loss_scale_factor")
    assert "data.max_response_length" in info.help


def test_explain_lists_registered_choices(fake_parts_manager):
    info = explain("algorithm.adv_estimator", get_plugin_manager())
    assert {"fakeestimator", "fakeestimator_with_args"} <= set(info.choices)


def test_explain_a_section_and_plugin_keys(fake_parts_manager):
    section = explain("rollout", get_plugin_manager())
    assert section.is_section and "engine_option" in section.children and "n" in section.children
    info = explain("rollout.engine_option", get_plugin_manager())
    assert info.owner == "fakeengine (fake-parts)" and info.default == 7


def test_explain_unknown_key(fake_parts_manager):
    with pytest.raises(
        RecipeError,
        match=r"actor.optim.lrr: unknown key; did you mean "
        r"'actor.optim.lr'\?",
    ):
        explain("actor.optim.lrr", get_plugin_manager())
    with pytest.raises(RecipeError, match="'lr' is an option, not a section"):
        explain("actor.optim.lr.x", get_plugin_manager())


@pytest.mark.parametrize("depth", [150, 1_000, 100_000])
def test_a_deeply_nested_recipe_is_one_line(write_recipe, base, depth):
    """A recipe nested thousands deep raised RecursionError with a traceback (the fourth
    drill); any depth past the limit is one RecipeError naming the file."""
    nested = "[" * depth + "]" * depth
    deep = write_recipe(f"actor:\n  x: {nested}\n", "deep.yaml")
    with pytest.raises(RecipeError) as caught:
        load(deep)
    assert str(caught.value) == (
        f"{deep} nests mappings or lists more than 100 levels deep; a recipe's sections are a "
        "few levels deep: check the file"
    )
    with pytest.raises(RecipeError, match=r"^override actor\.x nests mappings or lists more"):
        load(base, f"actor.x={nested}")
