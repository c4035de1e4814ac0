"""verl's names of recipe keys: the core's options, and those of the installed plugins' parts,
each with the part that declares it."""

import attrs

import plugrl
from plugrl.config import option
from plugrl.parts.rollout import RolloutConfig
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe.verl_names import verl_names


def only(index, verl):
    (name,) = index[verl]
    return name


def test_core_options(plugrl_plugin_manager):
    index = verl_names(get_plugin_manager())
    lr = only(index, "actor_rollout_ref.actor.optim.lr")
    assert (lr.key, lr.kind, lr.part, lr.default) == ("actor.optim.lr", None, None, 1e-6)
    assert only(index, "trainer.device").key == "device.name"
    assert only(index, "ray_kwargs.ray_init.num_cpus").key == "cluster.num_cpus"


def test_a_section_class_used_twice_takes_the_name_of_its_place(plugrl_plugin_manager):
    critic_lr = only(verl_names(get_plugin_manager()), "critic.optim.lr")
    # the critic's optimizer is the actor's class with its own default
    assert (critic_lr.key, critic_lr.default) == ("critic.optim.lr", 1e-5)


def test_options_of_installed_parts(plugrl_plugin_manager):
    index = verl_names(get_plugin_manager())
    offload = only(index, "actor_rollout_ref.actor.fsdp_config.param_offload")
    assert (offload.key, offload.kind, offload.part, offload.plugin) == (
        "actor.param_offload",
        "training_backends",
        "fsdp2",
        "fsdp2",
    )
    buffer = only(index, "reward_model.overlong_buffer.len")
    assert (buffer.key, buffer.part) == ("reward.overlong_buffer.len", "dapo")
    clip_cov = only(index, "actor_rollout_ref.actor.policy_loss.clip_cov_ratio")
    assert (clip_cov.key, clip_cov.part) == ("actor.policy_loss_args.clip_cov_ratio", "clip_cov")


@attrs.define(kw_only=True)
class _EngineConfig(RolloutConfig):
    enforce_eager: bool = option(
        False, "No graphs.", verl="actor_rollout_ref.rollout.enforce_eager"
    )


class _EnginePlugin:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        register("one", object, config=_EngineConfig)
        register("two", object, config=_EngineConfig)


def test_a_key_several_parts_declare(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(_EnginePlugin(), "engines")
    names = verl_names(get_plugin_manager())["actor_rollout_ref.rollout.enforce_eager"]
    assert [(n.key, n.part, n.plugin) for n in names if n.plugin == "engines"] == [
        ("rollout.enforce_eager", "one", "engines"),
        ("rollout.enforce_eager", "two", "engines"),
    ]
    # the base class's keys are the core's, not each engine's
    assert len(verl_names(get_plugin_manager())["actor_rollout_ref.rollout.n"]) == 1
