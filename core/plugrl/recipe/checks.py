"""Checks of a whole recipe: settings of one section that do not fit those of another.

Each would otherwise fail only mid-run (a batch that does not split over the ranks, after the
first rollout) or go unnoticed (eight identical greedy responses per prompt, a setting that is
ignored). :func:`check_recipe` runs in :func:`~plugrl.recipe.build_recipe`, so ``plugrl run
--print-config`` reports them too. It reads only the recipe: nothing here needs the model, the
data or the chosen plugins' classes (those checks run at start-up, in
:mod:`plugrl.algorithms.checks`).

Contradictions are a :class:`~plugrl.errors.RecipeError` naming the key to change; settings
that have no effect, or probably not the one meant, are one warning each on the
``plugrl.recipe`` logger.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import TYPE_CHECKING

import attrs

from plugrl.errors import RecipeError
from plugrl.parts.algorithm import KLControlConfig, PolicyLossConfig
from plugrl.recipe.teachers import check_distillation

if TYPE_CHECKING:
    from plugrl.recipe.sections import Recipe

logger = logging.getLogger("plugrl.recipe")


def check_recipe(recipe: Recipe, *, runnable_here: bool = True) -> None:
    """Raise a :class:`RecipeError` for settings that cannot work together; log a warning for
    each setting that has no effect or probably not the one meant. ``runnable_here=False``
    leaves out the packages the settings need installed here."""
    _check_local_cluster(recipe)
    _check_batch_sizes(recipe)
    _check_dynamic_batch_size(recipe)
    _check_dynamic_sampling(recipe)
    _check_engines(recipe)
    _check_sampling(recipe)
    _check_kl(recipe)
    _check_rollout_correction(recipe)
    _check_reward(recipe)
    _check_lora(recipe)
    check_distillation(recipe.distillation)
    if runnable_here:
        _check_packages(recipe)


def _warn(key: str, message: str) -> None:
    logger.warning("%s: %s", key, message)


def _trainer_ranks(recipe: Recipe) -> int:
    """Ranks of each training role: ``trainer.nnodes x trainer.n_gpus_per_node`` on Ray, one
    in this process for ``cluster: local``."""
    if recipe.cluster.mode != "ray":
        return 1
    return recipe.trainer.nnodes * recipe.trainer.n_gpus_per_node


def _check_local_cluster(recipe: Recipe) -> None:
    if recipe.cluster.mode != "local":
        return
    trainer, rollout = recipe.trainer, recipe.rollout
    ranks = trainer.nnodes * trainer.n_gpus_per_node
    if ranks > 1:
        raise RecipeError(
            f"'local' runs one trainer rank in this process, but trainer.nnodes x "
            f"trainer.n_gpus_per_node asks for {ranks}; set cluster.mode=ray, or both to 1",
            key="cluster.mode",
        )
    engine_devices = rollout.nnodes * rollout.n_gpus_per_node
    if not rollout.colocate and engine_devices > 1:
        raise RecipeError(
            f"'local' runs one rollout engine in this process, but rollout.nnodes x "
            f"rollout.n_gpus_per_node asks for {engine_devices} devices of engines; set "
            "cluster.mode=ray, or both to 1",
            key="cluster.mode",
        )


def _check_batch_sizes(recipe: Recipe) -> None:
    """What the trainer divides: the step's prompts into mini-batches, a mini-batch's
    sequences over the ranks, a rank's share into micro-batches."""
    data, actor, critic, rollout = recipe.data, recipe.actor, recipe.critic, recipe.rollout
    mini = actor.ppo_mini_batch_size
    if data.train_batch_size % mini:
        raise RecipeError(
            f"{mini} prompts per optimizer step do not divide data.train_batch_size="
            f"{data.train_batch_size}; make data.train_batch_size a multiple of "
            "actor.ppo_mini_batch_size",
            key="actor.ppo_mini_batch_size",
        )
    ranks = _trainer_ranks(recipe)
    # a backend that splits each model copy over several ranks splits a mini-batch only over
    # the copies (megatron: ranks / (tensor x pipeline x context parallel))
    dp = actor.data_parallel_size(ranks)
    over = (
        f"{ranks} ranks (trainer.nnodes x trainer.n_gpus_per_node)"
        if dp == ranks
        else f"{dp} data-parallel ranks ({ranks} ranks of trainer.nnodes x "
        f"trainer.n_gpus_per_node in model copies of {ranks // dp})"
    )
    rows = actor.mini_batch_rows(rollout.n)
    if rows % dp:
        raise RecipeError(
            f"ppo_mini_batch_size x rollout.n = {rows} sequences per optimizer step cannot be "
            f"split evenly over {over}; make it a multiple of {dp}",
            key="actor.ppo_mini_batch_size",
        )
    if actor.use_dynamic_bsz:
        return  # micro-batches are packed by tokens, any count of rows fits
    share = rows // dp
    micro_sizes = [("actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu)]
    if critic.enable is not False:
        micro_sizes.append(
            ("critic.ppo_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu)
        )
    for key, micro in micro_sizes:
        if micro is not None and share % micro:
            raise RecipeError(
                f"{micro} does not divide a rank's share of a mini-batch, {share} sequences "
                f"(actor.ppo_mini_batch_size {mini} x rollout.n {rollout.n} / {dp} "
                f"{'ranks' if dp == ranks else 'data-parallel ranks'}); "
                f"choose a divisor of {share}",
                key=key,
            )


def _check_dynamic_batch_size(recipe: Recipe) -> None:
    actor, data = recipe.actor, recipe.data
    if not actor.use_dynamic_bsz:
        return
    longest = data.max_prompt_length + data.max_response_length
    # a backend that splits each sequence over several ranks gives each rank a part of it
    split = actor.sequence_parallel_size()
    needed = -(-longest // split)
    if actor.ppo_max_token_len_per_gpu < needed:
        held = f"{actor.ppo_max_token_len_per_gpu} tokens"
        if split > 1:
            held += f" on each of the {split} ranks a sequence is split over"
        raise RecipeError(
            f"{held} cannot hold one sequence of data.max_prompt_length + "
            f"data.max_response_length = {longest} tokens; set it to at least {needed}",
            key="actor.ppo_max_token_len_per_gpu",
        )
    for key, size in (
        ("actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
        ("actor.log_prob_micro_batch_size_per_gpu", actor.log_prob_micro_batch_size_per_gpu),
        ("critic.ppo_micro_batch_size_per_gpu", recipe.critic.ppo_micro_batch_size_per_gpu),
    ):
        if size is not None:
            _warn(
                key,
                f"{size} is ignored: actor.use_dynamic_bsz packs micro-batches by "
                "actor.ppo_max_token_len_per_gpu tokens instead",
            )


def _check_dynamic_sampling(recipe: Recipe) -> None:
    data, filter_groups = recipe.data, recipe.algorithm.filter_groups
    per_round = data.gen_batch_size or data.train_batch_size
    if not filter_groups.enable:
        if per_round != data.train_batch_size:
            _warn(
                "data.gen_batch_size",
                "used only with algorithm.filter_groups.enable=true; each step generates "
                f"data.train_batch_size={data.train_batch_size} prompts",
            )
        return
    rounds = filter_groups.max_num_gen_batches
    if rounds and per_round * rounds < data.train_batch_size:
        raise RecipeError(
            f"{rounds} generation rounds of {per_round} prompts (data.gen_batch_size) can never "
            f"collect the {data.train_batch_size} groups of data.train_batch_size, even if every "
            f"group is kept; allow at least {math.ceil(data.train_batch_size / per_round)}, or "
            "0 for no limit",
            key="algorithm.filter_groups.max_num_gen_batches",
        )
    if recipe.rollout.n == 1:
        _warn(
            "algorithm.filter_groups.enable",
            "keeps every group of one response, and rollout.n is 1: dynamic sampling will "
            "drop nothing",
        )


def _check_engines(recipe: Recipe) -> None:
    rollout = recipe.rollout
    tp = rollout.tensor_model_parallel_size
    engine_devices = rollout.nnodes * rollout.n_gpus_per_node
    if rollout.colocate:
        if engine_devices > 1:
            _warn(
                "rollout.n_gpus_per_node",
                f"rollout.nnodes x rollout.n_gpus_per_node = {engine_devices} devices are "
                "unused: with rollout.colocate true the engines share the trainer's devices; "
                "set rollout.colocate=false to give the engines devices of their own",
            )
        if recipe.cluster.mode == "ray" and tp != 1:
            _check_colocated_span(recipe, tp)
    elif recipe.cluster.mode == "ray" and engine_devices % tp:
        raise RecipeError(
            f"rollout.nnodes x rollout.n_gpus_per_node = {engine_devices} devices do not "
            f"divide into engines of rollout.tensor_model_parallel_size={tp}",
            key="rollout.n_gpus_per_node",
        )


def _check_colocated_span(recipe: Recipe, tp: int) -> None:
    """Colocated engines of ``tp`` devices each take the devices of ``tp`` consecutive trainer
    ranks; more than a node's devices make an engine that spans nodes."""
    trainer = recipe.trainer
    world = trainer.nnodes * trainer.n_gpus_per_node
    if world < tp:
        raise RecipeError(
            f"{tp} devices per engine is more than the trainer's {world} (trainer.nnodes x "
            "trainer.n_gpus_per_node), whose devices colocated engines share; use at most "
            f"{world}, or set rollout.colocate=false to give the engines devices of their own",
            key="rollout.tensor_model_parallel_size",
        )
    if world % tp:
        raise RecipeError(
            f"engines of {tp} devices do not divide the trainer's {world} devices "
            "(trainer.nnodes x trainer.n_gpus_per_node), which colocated engines share; use "
            "a divisor of it, or set rollout.colocate=false",
            key="rollout.tensor_model_parallel_size",
        )


def _check_sampling(recipe: Recipe) -> None:
    rollout = recipe.rollout
    n = rollout.n
    identical = (
        f"so the rollout.n={n} responses to a prompt are identical and their group-relative "
        "advantages 0"
    )
    if n > 1 and not rollout.do_sample:
        raise RecipeError(
            f"false samples greedily, {identical}; set rollout.do_sample=true or rollout.n=1",
            key="rollout.do_sample",
        )
    if n > 1 and rollout.temperature == 0:
        raise RecipeError(
            f"0 samples greedily, {identical}; set rollout.temperature > 0 or rollout.n=1",
            key="rollout.temperature",
        )
    val = rollout.val_kwargs
    if val.n > 1 and not val.do_sample:
        _warn(
            "rollout.val_kwargs.n",
            f"the {val.n} samples of a validation prompt are identical since "
            f"rollout.val_kwargs.do_sample is false (greedy): mean@{val.n} costs {val.n} times "
            "mean@1 and measures the same; set rollout.val_kwargs.do_sample=true with a "
            "temperature > 0, or n=1",
        )
    elif val.do_sample and val.temperature == 0:
        _warn(
            "rollout.val_kwargs.temperature",
            "0 samples greedily although rollout.val_kwargs.do_sample is true; set a "
            "temperature > 0 to sample",
        )


def _check_kl(recipe: Recipe) -> None:
    actor, algorithm = recipe.actor, recipe.algorithm
    control = algorithm.kl_ctrl
    if algorithm.use_kl_in_reward and control.type == "adaptive" and not control.target_kl > 0:
        raise RecipeError(
            f"the adaptive KL controller needs a target_kl > 0 (got {control.target_kl}); "
            "set it or use algorithm.kl_ctrl.type=fixed",
            key="algorithm.kl_ctrl.target_kl",
        )
    if actor.use_kl_loss and algorithm.use_kl_in_reward:
        _warn(
            "algorithm.use_kl_in_reward",
            "actor.use_kl_loss is true too, so the KL to the reference model is penalised "
            "twice, in the reward and in the loss; keep one",
        )
    # a coefficient set for the other mechanism is the usual slip of a converted verl script
    if not algorithm.use_kl_in_reward and algorithm.kl_ctrl != KLControlConfig():
        _warn(
            "algorithm.kl_ctrl",
            "is used only with algorithm.use_kl_in_reward=true and is ignored; the KL loss's "
            "coefficient is actor.kl_loss_coef",
        )
    default_coef = attrs.fields(PolicyLossConfig).kl_loss_coef.default
    if not actor.use_kl_loss and actor.kl_loss_coef != default_coef:
        _warn(
            "actor.kl_loss_coef",
            f"{actor.kl_loss_coef} is ignored: the KL loss is off (set actor.use_kl_loss=true)",
        )


def _check_rollout_correction(recipe: Recipe) -> None:
    algorithm = recipe.algorithm
    if algorithm.kpop_threshold is not None and algorithm.rollout_is is None:
        raise RecipeError(
            "KPop masks tokens inside the rollout correction, which is off; set "
            "algorithm.rollout_is=token (or unset algorithm.kpop_threshold)",
            key="algorithm.kpop_threshold",
        )
    icepop = isinstance(algorithm.rollout_is_threshold, str)
    if icepop and algorithm.rollout_is is None:
        _warn(
            "algorithm.rollout_is_threshold",
            "IcePop's bounds are ignored: the rollout correction is off (set "
            "algorithm.rollout_is=token)",
        )


def _check_reward(recipe: Recipe) -> None:
    custom = recipe.reward.custom_function
    functions = {"reward": (custom.path, custom.kwargs)}
    for name, component in recipe.reward.components.items():
        # a component's section holds the custom function it inherited, if any
        own = component.get("custom_function") or {}
        functions[f"reward.components.{name}"] = (own.get("path"), own.get("kwargs"))
    for prefix, (path, kwargs) in functions.items():
        if kwargs and not path:
            raise RecipeError(
                f"set without {prefix}.custom_function.path, so no function receives them; set "
                "the path of the file that defines the function, or give a registered function "
                "its options with reward.function_args.<name>",
                key=f"{prefix}.custom_function.kwargs",
            )


def _check_lora(recipe: Recipe) -> None:
    if recipe.model.lora_rank > 0 and not type(recipe.actor).supports_lora:
        raise RecipeError(
            f"is {recipe.model.lora_rank}, but the {recipe.actor.backend} backend trains no "
            "LoRA adapters; set model.lora_rank=0 to train every weight, or "
            "actor.backend=fsdp2",
            key="model.lora_rank",
        )
    if recipe.rollout.lora_sync == "adapters":
        if recipe.model.lora_rank <= 0:
            raise RecipeError(
                "is adapters, but the actor trains no LoRA adapters (model.lora_rank is 0); "
                "set model.lora_rank > 0, or rollout.lora_sync=auto",
                key="rollout.lora_sync",
            )
        if not type(recipe.rollout).supports_lora_adapters:
            raise RecipeError(
                f"is adapters, but the {recipe.rollout.engine} rollout engine takes no LoRA "
                "adapters apart from its weights; set rollout.lora_sync=merged (or auto), or "
                "rollout.engine=vllm",
                key="rollout.lora_sync",
            )
        if not getattr(type(recipe.actor), "sends_lora_adapters", False):
            raise RecipeError(
                f"is adapters, but the {recipe.actor.backend} backend sends no LoRA adapters "
                "apart from its weights; set rollout.lora_sync=merged (or auto)",
                key="rollout.lora_sync",
            )
    if recipe.model.lora_rank > 0 and recipe.model.lora_alpha == 0:
        raise RecipeError(
            f"is 0, so the adapters of rank {recipe.model.lora_rank} would change nothing; set "
            "it > 0 (16, or twice model.lora_rank)",
            key="model.lora_alpha",
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_packages(recipe: Recipe) -> None:
    """Optional packages that the chosen plugins need for these settings (peft for
    ``model.lora_rank`` on fsdp2): refused now, not after a minute of loading the model."""
    for field in attrs.fields(type(recipe)):
        section = getattr(recipe, field.name)
        packages_needed = getattr(section, "packages_needed", None)
        if packages_needed is None:
            continue
        for need in packages_needed(recipe):
            if not _installed(need.module):
                value = _value_at(recipe, need.key)
                raise RecipeError(
                    f"is {value!r}, which needs the package {need.module}, not installed "
                    f"here; {need.install}",
                    key=need.key,
                )


def _value_at(recipe: Recipe, key: str) -> object:
    value: object = recipe
    for name in key.split("."):
        value = getattr(value, name)
    return value
