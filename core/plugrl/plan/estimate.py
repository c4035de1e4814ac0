"""The plan of a recipe: ask each chosen plugin for its terms, group them per device and
phase, and judge them against the device's memory."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from plugrl.parts.rollout import lora_sync_mode
from plugrl.plan.context import PlanContext, micro_batches, trainer_ranks
from plugrl.plan.shape import ModelShape, read_shape
from plugrl.plan.terms import (
    MIB,
    MemoryTerm,
    Plan,
    Unestimated,
    dtype_bytes,
    phase_estimates,
)

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

TRAINER = "trainer"
ROLLOUT = "rollout"
REWARD_MODEL = "reward_model"


def model_shape(recipe: Recipe, model_config: str | None = None) -> ModelShape:
    """The policy's shape: ``model_config`` (a config.json or a folder) when given, else
    ``model.path`` (a model folder or a shipped shape's name)."""
    source = model_config or recipe.model.path
    if source is None:
        from plugrl.errors import RecipeError

        raise RecipeError(
            "model.path is not set; set it to a model folder or a shipped shape (qwen2.5-7b), "
            "or give --model-config PATH",
            key="model.path",
        )
    return read_shape(source, recipe.model.override_config or None)


def _roles(recipe: Recipe) -> list[tuple[str, str, str]]:
    """(role, the plugin that owns it, the devices it sits on) for each model the run builds."""
    backend = recipe.actor.backend
    roles = [("actor", backend, TRAINER)]
    uses_kl = getattr(recipe.actor, "use_kl_loss", False) or getattr(
        recipe.algorithm, "use_kl_in_reward", False
    )
    if uses_kl and recipe.model.lora_rank == 0:
        roles.append(("ref", backend, TRAINER))
    if _critic_enabled(recipe):
        roles.append(("critic", backend, TRAINER))
    engine_devices = TRAINER if recipe.rollout.colocate else ROLLOUT
    roles.append(("rollout", recipe.rollout.engine, engine_devices))
    manager = recipe.reward.manager
    if manager == "reward_model":
        # placement local: the model lives in the driver, on the trainer's device in one process
        alone = recipe.cluster.mode == "ray" or recipe.reward.placement == "ray"
        roles.append(("reward_model", manager, REWARD_MODEL if alone else TRAINER))
    elif manager == "judge":
        roles.append(("judge", manager, "judge"))
    return roles


def _critic_enabled(recipe: Recipe) -> bool:
    if recipe.critic.enable is not None:
        return bool(recipe.critic.enable)
    return recipe.algorithm.adv_estimator == "gae"


def weight_sync_terms(recipe: Recipe, shape: ModelShape, context: PlanContext) -> list[MemoryTerm]:
    """The buffers of a weight push, on the trainer's devices: one bucket of
    ``rollout.update_weights_bucket_megabytes`` (a weight larger than that travels alone, so
    the largest weight, the vocabulary table, when it is larger), in the rollout dtype. When
    the push is the LoRA adapters alone (``rollout.lora_sync`` resolving to adapters) the
    bucket holds at most every adapter's factors, in ``model.dtype``."""
    bucket = recipe.rollout.update_weights_bucket_megabytes * MIB
    # the plan is for accelerators: device.name auto counts as one, as detection would find
    if lora_sync_mode(recipe, recipe.device.name) == "adapters":
        factors = shape.lora_parameters(recipe.model.lora_rank, recipe.model.target_modules)
        adapters = factors * dtype_bytes(recipe.model.dtype)
        return [
            MemoryTerm(
                "weight-sync bucket",
                min(bucket, adapters),
                ("generate",),
                "weight_sync",
                note=f"LoRA adapters alone (rollout.lora_sync): {factors:,} factors x "
                f"{dtype_bytes(recipe.model.dtype)} B ({recipe.model.dtype}), at most "
                f"update_weights_bucket_megabytes={bucket // MIB} MiB",
                instant="weight push",
            )
        ]
    rollout_dtype = recipe.rollout.dtype if recipe.rollout.dtype != "auto" else "bfloat16"
    largest = shape.vocab_size * shape.hidden_size * dtype_bytes(rollout_dtype)
    return [
        MemoryTerm(
            "weight-sync bucket",
            max(bucket, largest),
            ("generate",),
            "weight_sync",
            note=f"max(update_weights_bucket_megabytes={bucket // MIB} MiB, largest weight "
            f"{largest / MIB:.0f} MiB in {rollout_dtype})",
            instant="weight push",
        )
    ]


def plan_recipe(
    recipe: Recipe,
    device_memory: int | None,
    plugins: PluginManager,
    *,
    shape: ModelShape | None = None,
) -> Plan:
    """The memory plan of ``recipe``: every phase on every kind of device, from the terms the
    chosen plugins (``plugins``, the run's or the command's) report through the
    ``estimate_memory`` hook. ``device_memory`` is the bytes of one device (None: no
    verdict); ``shape`` the policy's shape (default: read from ``model.path``). Nothing is
    loaded."""
    shape = shape or model_shape(recipe)
    ranks = trainer_ranks(recipe)
    update, log_prob = micro_batches(recipe, ranks)
    colocated = recipe.rollout.colocate
    rollout_devices = ranks if colocated else recipe.rollout.nnodes * recipe.rollout.n_gpus_per_node
    rows = (recipe.data.gen_batch_size or recipe.data.train_batch_size) * recipe.rollout.n

    @functools.cache
    def shape_of(path: str) -> ModelShape:
        return read_shape(path)

    context = PlanContext(
        trainer_ranks=ranks,
        rollout_devices=rollout_devices,
        colocated=colocated,
        device_memory=device_memory,
        update=update,
        log_prob=log_prob,
        rollout_rows=rows,
        sequence_length=recipe.data.max_prompt_length + recipe.data.max_response_length,
        shape_of=shape_of,
    )
    by_devices: dict[str, list[MemoryTerm]] = {}
    unestimated: list[Unestimated] = []
    for role, owner, devices in _roles(recipe):
        answers = plugins.hook.estimate_memory(
            recipe=recipe, role=role, shape=shape, context=context
        )
        terms = [term for answer in answers if answer is not None for term in answer]
        if not any(answer is not None for answer in answers):
            unestimated.append(Unestimated(role, owner, devices))
            continue
        by_devices.setdefault(devices, []).extend(terms)
    if recipe.rollout.weight_transport != "none":
        by_devices.setdefault(TRAINER, []).extend(weight_sync_terms(recipe, shape, context))
    notes = []
    if recipe.cluster.mode != "ray":
        notes.append("cluster.mode=local: one process, one device for every role")
    phases = phase_estimates(by_devices, device_memory)
    for phase in phases:
        if phase.fits is False:
            notes += [t.caveat for t in phase.terms if t.caveat and t.caveat not in notes]
    return Plan(
        model=shape.name,
        parameters=shape.parameters(),
        phases=phases,
        unestimated=tuple(unestimated),
        device_memory=device_memory,
        notes=tuple(notes),
    )
