"""Settings of one section that contradict another stop the recipe when it is read (or warn),
instead of failing after the first rollout or going unnoticed."""

import logging
import sys
from pathlib import Path

import pytest

from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import apply_overrides, build_recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]


def build(*overrides):
    return build_recipe(apply_overrides({}, overrides), get_plugin_manager())


def error_of(*overrides) -> str:
    with pytest.raises(RecipeError) as info:
        build(*overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def warnings_of(caplog, *overrides) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="plugrl.recipe"):
        build(*overrides)
    return [r.getMessage() for r in caplog.records if r.name == "plugrl.recipe"]


# Two ranks on Ray, mini-batches of 4 prompts x 2 responses: 4 sequences per rank.
TWO_RANKS = (
    "cluster=ray",
    "trainer.n_gpus_per_node=2",
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=2",
)


def test_the_default_recipe_passes_without_warnings(caplog):
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml")))
def test_the_shipped_recipes_pass_without_warnings(caplog, name):
    with caplog.at_level(logging.WARNING, logger="plugrl.recipe"):
        load_recipe(ROOT / "recipes" / f"{name}.yaml", (), get_plugin_manager())
    assert [r.getMessage() for r in caplog.records if r.name == "plugrl.recipe"] == []


# ------------------------------------------------------------------------------ batch sizes


def test_mini_batches_must_divide_the_step():
    assert error_of("data.train_batch_size=96", "actor.ppo_mini_batch_size=64") == (
        "actor.ppo_mini_batch_size: 64 prompts per optimizer step do not divide "
        "data.train_batch_size=96; make data.train_batch_size a multiple of "
        "actor.ppo_mini_batch_size"
    )
    build("data.train_batch_size=128", "actor.ppo_mini_batch_size=64")


def test_a_mini_batch_must_split_over_the_trainer_ranks():
    assert error_of(*TWO_RANKS, "trainer.n_gpus_per_node=3") == (
        "actor.ppo_mini_batch_size: ppo_mini_batch_size x rollout.n = 8 sequences per "
        "optimizer step cannot be split evenly over 3 ranks (trainer.nnodes x "
        "trainer.n_gpus_per_node); make it a multiple of 3"
    )
    # nodes count too: 2 x 2 ranks share 8 sequences evenly
    build(*TWO_RANKS, "trainer.nnodes=2")
    assert "over 6 ranks" in error_of(*TWO_RANKS, "trainer.nnodes=3")


def test_a_micro_batch_must_divide_a_ranks_share():
    assert error_of(*TWO_RANKS, "actor.ppo_micro_batch_size_per_gpu=3") == (
        "actor.ppo_micro_batch_size_per_gpu: 3 does not divide a rank's share of a mini-batch, "
        "4 sequences (actor.ppo_mini_batch_size 4 x rollout.n 2 / 2 ranks); choose a divisor "
        "of 4"
    )
    assert "choose a divisor of 4" in error_of(*TWO_RANKS, "actor.ppo_micro_batch_size_per_gpu=8")
    build(*TWO_RANKS, "actor.ppo_micro_batch_size_per_gpu=2")
    # packed by tokens, the count of rows does not matter
    build(*TWO_RANKS, "actor.ppo_micro_batch_size_per_gpu=3", "actor.use_dynamic_bsz=true")


def test_the_critics_micro_batch_must_divide_a_ranks_share_when_a_critic_may_train():
    assert error_of(*TWO_RANKS, "critic.ppo_micro_batch_size_per_gpu=3") == (
        "critic.ppo_micro_batch_size_per_gpu: 3 does not divide a rank's share of a "
        "mini-batch, 4 sequences (actor.ppo_mini_batch_size 4 x rollout.n 2 / 2 ranks); "
        "choose a divisor of 4"
    )
    build(*TWO_RANKS, "critic.ppo_micro_batch_size_per_gpu=3", "critic.enable=false")


def test_a_token_budget_must_hold_the_longest_sequence():
    overrides = ("actor.use_dynamic_bsz=true", "data.max_prompt_length=100")
    assert error_of(*overrides, "actor.ppo_max_token_len_per_gpu=611") == (
        "actor.ppo_max_token_len_per_gpu: 611 tokens cannot hold one sequence of "
        "data.max_prompt_length + data.max_response_length = 612 tokens; set it to at least 612"
    )
    build(*overrides, "actor.ppo_max_token_len_per_gpu=612")
    build("actor.ppo_max_token_len_per_gpu=611")  # unused without use_dynamic_bsz


def test_micro_batch_sizes_are_ignored_with_dynamic_batch_sizes(caplog):
    assert warnings_of(
        caplog,
        "actor.use_dynamic_bsz=true",
        "actor.ppo_micro_batch_size_per_gpu=4",
        "actor.log_prob_micro_batch_size_per_gpu=8",
        "critic.ppo_micro_batch_size_per_gpu=2",
    ) == [
        "actor.ppo_micro_batch_size_per_gpu: 4 is ignored: actor.use_dynamic_bsz packs "
        "micro-batches by actor.ppo_max_token_len_per_gpu tokens instead",
        "actor.log_prob_micro_batch_size_per_gpu: 8 is ignored: actor.use_dynamic_bsz packs "
        "micro-batches by actor.ppo_max_token_len_per_gpu tokens instead",
        "critic.ppo_micro_batch_size_per_gpu: 2 is ignored: actor.use_dynamic_bsz packs "
        "micro-batches by actor.ppo_max_token_len_per_gpu tokens instead",
    ]


# ------------------------------------------------------------------------ dynamic sampling

DYNAMIC = (
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=8",
    "rollout.n=2",
    "algorithm.filter_groups.enable=true",
)


def test_generation_rounds_that_can_never_fill_a_step():
    overrides = (*DYNAMIC, "data.gen_batch_size=3")
    assert error_of(*overrides, "algorithm.filter_groups.max_num_gen_batches=2") == (
        "algorithm.filter_groups.max_num_gen_batches: 2 generation rounds of 3 prompts "
        "(data.gen_batch_size) can never collect the 8 groups of data.train_batch_size, even "
        "if every group is kept; allow at least 3, or 0 for no limit"
    )
    build(*overrides, "algorithm.filter_groups.max_num_gen_batches=3")
    build(*overrides, "algorithm.filter_groups.max_num_gen_batches=0")


def test_gen_batch_size_without_dynamic_sampling_warns(caplog):
    assert warnings_of(
        caplog, "data.train_batch_size=256", "data.gen_batch_size=512", "rollout.n=2"
    ) == [
        "data.gen_batch_size: used only with algorithm.filter_groups.enable=true; each step "
        "generates data.train_batch_size=256 prompts"
    ]
    assert warnings_of(caplog, "data.train_batch_size=256", "data.gen_batch_size=256") == []


def test_dynamic_sampling_with_one_response_per_prompt_warns(caplog):
    assert warnings_of(caplog, *DYNAMIC, "rollout.n=1") == [
        "algorithm.filter_groups.enable: keeps every group of one response, and rollout.n is "
        "1: dynamic sampling will drop nothing"
    ]
    assert warnings_of(caplog, *DYNAMIC) == []


# ------------------------------------------------------------------------- cluster, engines


@pytest.mark.parametrize("override", ["trainer.n_gpus_per_node=2", "trainer.nnodes=2"])
def test_local_mode_runs_one_trainer_rank(override):
    assert error_of(override) == (
        "cluster.mode: 'local' runs one trainer rank in this process, but trainer.nnodes x "
        "trainer.n_gpus_per_node asks for 2; set cluster.mode=ray, or both to 1"
    )
    build(override, "cluster=ray")


def test_local_mode_runs_one_engine_of_its_own():
    overrides = ("rollout.colocate=false", "rollout.n_gpus_per_node=2")
    assert error_of(*overrides) == (
        "cluster.mode: 'local' runs one rollout engine in this process, but rollout.nnodes x "
        "rollout.n_gpus_per_node asks for 2 devices of engines; set cluster.mode=ray, or both "
        "to 1"
    )
    build(*overrides, "cluster=ray")
    build("rollout.colocate=false")


def test_engines_of_their_own_must_divide_into_tensor_parallel_groups():
    overrides = ("cluster=ray", "rollout.colocate=false", "rollout.tensor_model_parallel_size=2")
    assert error_of(*overrides, "rollout.n_gpus_per_node=3") == (
        "rollout.n_gpus_per_node: rollout.nnodes x rollout.n_gpus_per_node = 3 devices do not "
        "divide into engines of rollout.tensor_model_parallel_size=2"
    )
    build(*overrides, "rollout.n_gpus_per_node=4")
    build(*overrides, "rollout.nnodes=3", "rollout.n_gpus_per_node=2")


def test_colocated_engines_on_ray_span_consecutive_trainer_devices():
    tp2 = ("cluster=ray", "rollout.tensor_model_parallel_size=2")
    build(*tp2, "trainer.n_gpus_per_node=2")
    build(*tp2, "trainer.n_gpus_per_node=4")
    build(*tp2, "trainer.nnodes=2", "trainer.n_gpus_per_node=2")
    assert error_of(*tp2) == (
        "rollout.tensor_model_parallel_size: 2 devices per engine is more than the trainer's 1 "
        "(trainer.nnodes x trainer.n_gpus_per_node), whose devices colocated engines share; use "
        "at most 1, or set rollout.colocate=false to give the engines devices of their own"
    )
    batches = ("data.train_batch_size=12", "actor.ppo_mini_batch_size=6")
    assert error_of(*tp2, *batches, "trainer.n_gpus_per_node=3") == (
        "rollout.tensor_model_parallel_size: engines of 2 devices do not divide the trainer's 3 "
        "devices (trainer.nnodes x trainer.n_gpus_per_node), which colocated engines share; "
        "use a divisor of it, or set rollout.colocate=false"
    )
    # engines larger than a node span nodes: two engines of four over four nodes of two
    tp4 = ("cluster=ray", "rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=2")
    build(*tp4, "trainer.nnodes=4")
    build(
        "cluster=ray",
        "rollout.tensor_model_parallel_size=16",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
    )
    assert error_of(*tp4, "trainer.nnodes=3", *batches).startswith(
        "rollout.tensor_model_parallel_size: engines of 4 devices do not divide the trainer's 6"
    )


def test_devices_of_their_own_are_unused_by_colocated_engines(caplog):
    assert warnings_of(caplog, "cluster=ray", "rollout.nnodes=2", "rollout.n_gpus_per_node=4") == [
        "rollout.n_gpus_per_node: rollout.nnodes x rollout.n_gpus_per_node = 8 devices are "
        "unused: with rollout.colocate true the engines share the trainer's devices; set "
        "rollout.colocate=false to give the engines devices of their own"
    ]


# --------------------------------------------------------------------------------- sampling


def test_greedy_sampling_of_several_responses_is_an_error():
    assert error_of("rollout.n=4", "rollout.do_sample=false") == (
        "rollout.do_sample: false samples greedily, so the rollout.n=4 responses to a prompt "
        "are identical and their group-relative advantages 0; set rollout.do_sample=true or "
        "rollout.n=1"
    )
    assert error_of("rollout.n=4", "rollout.temperature=0") == (
        "rollout.temperature: 0 samples greedily, so the rollout.n=4 responses to a prompt are "
        "identical and their group-relative advantages 0; set rollout.temperature > 0 or "
        "rollout.n=1"
    )
    build("rollout.n=1", "rollout.do_sample=false")
    build("rollout.n=1", "rollout.temperature=0")


def test_greedy_validation_samples_warn(caplog):
    assert warnings_of(caplog, "rollout.val_kwargs.n=4") == [
        "rollout.val_kwargs.n: the 4 samples of a validation prompt are identical since "
        "rollout.val_kwargs.do_sample is false (greedy): mean@4 costs 4 times mean@1 and "
        "measures the same; set rollout.val_kwargs.do_sample=true with a temperature > 0, or n=1"
    ]
    assert warnings_of(caplog, "rollout.val_kwargs.do_sample=true") == [
        "rollout.val_kwargs.temperature: 0 samples greedily although "
        "rollout.val_kwargs.do_sample is true; set a temperature > 0 to sample"
    ]
    sampled = ("rollout.val_kwargs.do_sample=true", "rollout.val_kwargs.temperature=0.6")
    assert warnings_of(caplog, *sampled, "rollout.val_kwargs.n=4") == []


# ---------------------------------------------------------------------------------------- KL


def test_kl_in_the_loss_and_in_the_reward_warns(caplog):
    assert warnings_of(caplog, "actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true") == [
        "algorithm.use_kl_in_reward: actor.use_kl_loss is true too, so the KL to the reference "
        "model is penalised twice, in the reward and in the loss; keep one"
    ]


def test_kl_settings_of_the_mechanism_that_is_off_warn(caplog):
    assert warnings_of(caplog, "actor.use_kl_loss=true", "algorithm.kl_ctrl.kl_coef=0.05") == [
        "algorithm.kl_ctrl: is used only with algorithm.use_kl_in_reward=true and is ignored; "
        "the KL loss's coefficient is actor.kl_loss_coef"
    ]
    assert warnings_of(caplog, "actor.kl_loss_coef=0.05") == [
        "actor.kl_loss_coef: 0.05 is ignored: the KL loss is off (set actor.use_kl_loss=true)"
    ]
    # the defaults, written out as converted verl scripts do, are no mistake
    assert warnings_of(caplog, "algorithm.kl_ctrl.kl_coef=0.001", "actor.kl_loss_coef=0.001") == []


def test_adaptive_kl_in_reward_needs_a_target():
    assert error_of(
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.target_kl=0",
    ) == (
        "algorithm.kl_ctrl.target_kl: the adaptive KL controller needs a target_kl > 0 (got "
        "0.0); set it or use algorithm.kl_ctrl.type=fixed"
    )


def test_each_warning_is_logged_once_per_recipe(caplog):
    warnings = warnings_of(caplog, "actor.kl_loss_coef=0.05", "rollout.val_kwargs.n=2")
    assert len(warnings) == len(set(warnings)) == 2


def test_custom_function_kwargs_without_a_path_are_refused():
    with pytest.raises(RecipeError) as info:
        build_recipe(
            {"reward": {"custom_function": {"kwargs": {"binary": True}}}}, get_plugin_manager()
        )
    assert str(info.value) == (
        "reward.custom_function.kwargs: set without reward.custom_function.path, so no function "
        "receives them; set the path of the file that defines the function, or give a "
        "registered function its options with reward.function_args.<name>"
    )


def test_lora_options_read_a_word_a_pattern_or_a_list():
    recipe = build("model.lora_rank=8", "model.target_modules=all-linear")
    assert recipe.model.target_modules == "all-linear"
    assert recipe.model.exclude_modules is None
    recipe = build("model.lora_rank=8", "model.target_modules=[q_proj,v_proj]")
    assert recipe.model.target_modules == ["q_proj", "v_proj"]
    recipe = build("model.exclude_modules=.*layers\\.0\\..*")
    assert recipe.model.exclude_modules == ".*layers\\.0\\..*"


def test_lora_options_of_the_wrong_kind_are_refused():
    assert error_of("model.lora_rank=-1") == "model.lora_rank: must be >= 0, got -1"
    assert error_of("model.target_modules={q: 1}") == (
        "model.target_modules: expected a string or a list of strings, got {'q': 1}"
    )
    from plugrl.config import ConfigValueError
    from plugrl.recipe import ModelConfig

    with pytest.raises(ConfigValueError) as info:
        ModelConfig(exclude_modules=[3])
    assert str(info.value) == (
        "exclude_modules: must be a string or a list of module names, got [3]"
    )


def test_lora_alpha_zero_is_refused_only_with_adapters():
    assert build("model.lora_alpha=0").model.lora_alpha == 0  # verl scripts with LoRA off
    assert error_of("model.lora_rank=8", "model.lora_alpha=0") == (
        "model.lora_alpha: is 0, so the adapters of rank 8 would change nothing; set it > 0 "
        "(16, or twice model.lora_rank)"
    )


def test_lora_without_peft_is_refused_when_the_recipe_is_read(monkeypatch):
    """The shipped LoRA recipe on an install without peft stops at reading, with the package
    and the command, not after the model has loaded."""
    assert build("model.lora_rank=8").model.lora_rank == 8  # peft is installed with plugrl
    monkeypatch.setitem(sys.modules, "peft", None)  # find_spec says it is absent
    assert build("model.lora_rank=0").model.lora_rank == 0
    with pytest.raises(RecipeError) as info:
        load_recipe("quickstart-lora", [], get_plugin_manager())
    assert str(info.value) == (
        "model.lora_rank: is 32, which needs the package peft, not installed here; "
        "pip install peft (or set model.lora_rank=0)"
    )


def test_adapter_sync_is_refused_where_it_cannot_happen():
    assert error_of("model.lora_rank=8", "rollout.lora_sync=adapters") == (
        "rollout.lora_sync: is adapters, but the hf rollout engine takes no LoRA adapters apart "
        "from its weights; set rollout.lora_sync=merged (or auto), or rollout.engine=vllm"
    )
    assert error_of("rollout.lora_sync=adapters") == (
        "rollout.lora_sync: is adapters, but the actor trains no LoRA adapters "
        "(model.lora_rank is 0); set model.lora_rank > 0, or rollout.lora_sync=auto"
    )
    # the hf engine takes merged weights: auto sends them
    from plugrl.parts.rollout import lora_sync_mode

    assert lora_sync_mode(build("model.lora_rank=8"), "cuda") == "merged"
