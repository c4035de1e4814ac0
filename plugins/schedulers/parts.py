"""What every scheduler builds before its loop: tokenizer, data, reward, algorithm pieces, the
backend worker groups and the rollout engine, resolved from the recipe and checked up front so
that a bad recipe or bad data fails before the first generation."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from plugrl.checkpoint import CheckpointManager

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.cluster import WorkerGroup
    from plugrl.data.dataset import PromptDataset, PromptLoader
    from plugrl.parts.algorithm import AdvantageEstimator
    from plugrl.parts.device import Device
    from plugrl.parts.reward import RewardManager
    from plugrl.parts.rollout import RolloutEngine
    from plugrl.recipe import Recipe
    from plugrl.run import RunContext

logger = logging.getLogger("plugrl.run")


def sampling_seed(seed: int, step: int, purpose: int = 0) -> int:
    """A seed per (run seed, step): a resumed run samples exactly what the uninterrupted one
    did, without saving the engine's generator."""
    return (seed * 1_000_003 + step * 7919 + purpose) % (2**63 - 1)


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


@attrs.define
class RunParts:
    """The built parts of a run, shared by the schedulers."""

    recipe: Recipe
    device: Device
    tokenizer: Any
    pad_token_id: int
    train_data: PromptDataset
    val_data: PromptDataset | None
    train_loader: PromptLoader
    reward: RewardManager
    estimator: AdvantageEstimator
    objective: Any
    kl_in_reward: Any
    actor: WorkerGroup
    ref: WorkerGroup | None
    critic: WorkerGroup | None
    engine: RolloutEngine
    checkpoints: CheckpointManager
    total_training_steps: int
    colocated: bool = False
    old_log_probs_from_update: bool = False
    """The update is exactly on-policy and derives ``old_log_probs`` from its own forward, so
    the scheduler skips the separate pass (see :func:`update_derives_old_log_probs`)."""
    weight_version: int = 0
    placement: Any = None
    """The Ray devices the roles share (:class:`plugrl.cluster.RayPlacement`), or ``None``."""

    def sync_weights(self) -> None:
        """Give the engine the actor's current weights (no copy when colocated)."""
        if self.colocated:
            self.engine.bind_model(self.actor.rollout_model(), self.weight_version)
        else:
            self.engine.update_weights(self.actor.named_weights(), self.weight_version)

    def groups(self) -> dict[str, WorkerGroup]:
        named = {"actor": self.actor, "ref": self.ref, "critic": self.critic}
        return {name: group for name, group in named.items() if group is not None}

    def save_checkpoint(self, step: int, trainer_state: dict[str, Any]) -> Path:
        def write(folder: Path) -> None:
            self.actor.save_checkpoint(folder / "actor")
            if self.critic is not None:
                self.critic.save_checkpoint(folder / "critic")

        state = {
            "dataloader": self.train_loader.state_dict(),
            "weight_version": self.weight_version,
            "rng": rng_state(),
            "kl_in_reward": self.kl_in_reward.state_dict() if self.kl_in_reward else None,
            **trainer_state,
        }
        return self.checkpoints.save(step, write, state)

    def resume(self) -> dict[str, Any] | None:
        """Load the checkpoint ``trainer.resume_mode`` names; returns its trainer state."""
        path = self.checkpoints.resolve(self.recipe.trainer.resume_mode)
        if path is None:
            return None
        state = self.checkpoints.load_trainer_state(path)
        self.actor.load_checkpoint(path / "actor")
        if self.critic is not None:
            self.critic.load_checkpoint(path / "critic")
        self.train_loader.load_state_dict(state["dataloader"])
        self.weight_version = state["weight_version"]
        if self.kl_in_reward and state.get("kl_in_reward"):
            self.kl_in_reward.load_state_dict(state["kl_in_reward"])
        set_rng_state(state["rng"])
        logger.info("resumed from %s (step %d)", path, state["step"])
        return state

    def close(self) -> None:
        for closer in (
            self.engine.close,
            self.reward.close,
            *(group.close for group in self.groups().values()),
            *([self.placement.close] if self.placement is not None else []),
        ):
            try:
                closer()
            except Exception as exc:  # closing must not hide the error that ended the run
                logger.warning("closing %s failed: %s", closer, exc)


def training_loader(recipe: Recipe, dataset: PromptDataset, pad_token_id: int) -> PromptLoader:
    """The loader of training prompts: ``data.train_batch_size`` per batch, or with dynamic
    sampling ``data.gen_batch_size`` per generation round when set."""
    from plugrl.data.dataset import PromptLoader

    data = recipe.data
    if data.gen_batch_size is None or data.gen_batch_size == data.train_batch_size:
        return PromptLoader.for_training(dataset, data, pad_token_id)
    if not recipe.algorithm.filter_groups.enable:
        logger.warning(
            "data.gen_batch_size is used only with algorithm.filter_groups.enable=true; "
            "each step generates data.train_batch_size=%d prompts",
            data.train_batch_size,
        )
        return PromptLoader.for_training(dataset, data, pad_token_id)
    return PromptLoader.for_training(dataset, data, pad_token_id, per_generation_round=True)


def check_data_sources(reward: RewardManager, datasets: list[PromptDataset | None]) -> None:
    """Fail before any generation when a data source has no scorer, naming the first row
    that uses it (the reward's own message says how to add one)."""
    from plugrl.errors import DataError

    first_row: dict[str, str] = {}
    for dataset in datasets:
        for record in dataset.records if dataset is not None else []:
            first_row.setdefault(record.data_source, record.origin)
    for data_source, origin in sorted(first_row.items()):
        try:
            reward.check_data_sources([data_source])
        except DataError as exc:
            raise DataError(f"{origin}: {exc}") from None


def update_derives_old_log_probs(
    recipe: Recipe, backend_cls: type, estimator: AdvantageEstimator
) -> bool:
    """Whether a synchronous step may leave ``old_log_probs`` to the actor update.

    True when the update is one optimizer step over the whole batch (``ppo_epochs`` 1 and
    ``ppo_mini_batch_size`` equal to ``data.train_batch_size``): its forward then runs on the
    weights that sampled the batch, the same ones a separate pass would use. Nothing may read
    ``old_log_probs`` before the update (KL in the reward, an estimator that requires them),
    the backend must support it, and ``actor.reuse_on_policy_log_prob`` must allow it.
    """
    actor = recipe.actor
    return bool(
        actor.reuse_on_policy_log_prob
        and getattr(backend_cls, "derives_on_policy_old_log_probs", False)
        and actor.ppo_epochs == 1
        and actor.ppo_mini_batch_size == recipe.data.train_batch_size
        and not recipe.algorithm.use_kl_in_reward
        and "old_log_probs" not in estimator.requires
    )


def build_parts(context: RunContext) -> RunParts:
    """Build and check everything a run needs, in the order that fails cheapest first."""
    from plugrl.cluster import make_placement, make_worker_group
    from plugrl.data.dataset import (
        PromptDataset,
        load_tokenizer,
        pad_token_id_of,
    )
    from plugrl_plugins.algorithms.estimators import build_estimator
    from plugrl_plugins.algorithms.kl import KLInReward
    from plugrl_plugins.algorithms.objective import PolicyObjective
    from plugrl_plugins.algorithms.validate import check_algorithm
    from plugrl_plugins.rewards import build_reward_manager

    recipe, plugins = context.recipe, context.plugins
    check_algorithm(recipe, plugins)
    device = context.part("devices", context.device_name)(recipe.device)
    device.manual_seed(recipe.trainer.seed)
    random.seed(recipe.trainer.seed)
    np.random.seed(recipe.trainer.seed % 2**32)

    tokenizer = load_tokenizer(recipe.model)
    pad_token_id = pad_token_id_of(tokenizer)
    train_data = PromptDataset.train(recipe.data, tokenizer)
    val_data = PromptDataset.validation(recipe.data, tokenizer)
    train_loader = training_loader(recipe, train_data, pad_token_id)
    reward = build_reward_manager(recipe, tokenizer, plugins)
    check_data_sources(reward, [train_data, val_data])

    estimator = build_estimator(recipe, plugins)
    objective = PolicyObjective.from_recipe(recipe, plugins)
    algorithm = recipe.algorithm
    kl_in_reward = KLInReward.from_recipe(recipe, plugins) if algorithm.use_kl_in_reward else None
    total = recipe.trainer.total_training_steps or len(train_loader) * recipe.trainer.total_epochs

    needs_ref = recipe.actor.use_kl_loss or algorithm.use_kl_in_reward
    needs_values = "values" in estimator.requires
    critic_on = recipe.critic.enable if recipe.critic.enable is not None else needs_values
    roles = ["actor", *(["ref"] if needs_ref else []), *(["critic"] if critic_on else [])]
    built: list[Any] = [reward]
    placement = None

    def group(role: str) -> WorkerGroup:
        made = make_worker_group(
            recipe, role, device_name=context.device_name, plugins=plugins, placement=placement
        )
        built.append(made)
        made.setup(total)
        return made

    try:
        # on Ray the roles share the devices: rank i of each role on the i-th device
        placement = make_placement(recipe, roles, device_name=context.device_name, plugins=plugins)
        if placement is not None:
            built.append(placement)
        actor = group("actor")
        ref = group("ref") if needs_ref else None
        critic = group("critic") if critic_on else None
        colocated = recipe.rollout.colocate and actor.rollout_model() is not None
        engine_recipe = recipe
        if recipe.rollout.colocate and not colocated:
            # the engine cannot share a model that lives in other processes: it loads its own
            # copy and gets the actor's weights pushed after each step
            logger.info(
                "rollout.colocate: the actor runs in other processes, so the engine gets "
                "its weights pushed after each step instead of sharing them"
            )
            engine_recipe = attrs.evolve(
                recipe, rollout=attrs.evolve(recipe.rollout, colocate=False)
            )
        engine_cls = context.part("rollout_engines", recipe.rollout.engine)
        engine = engine_cls(engine_recipe, device=device, tokenizer=tokenizer)
    except BaseException:
        for part in reversed(built):  # no Ray actor or scoring worker outlives a failed start
            try:
                part.close()
            except Exception as exc:
                logger.warning("closing %s after a failed start failed: %s", part, exc)
        raise
    parts = RunParts(
        recipe=recipe,
        device=device,
        tokenizer=tokenizer,
        pad_token_id=pad_token_id,
        train_data=train_data,
        val_data=val_data,
        train_loader=train_loader,
        reward=reward,
        estimator=estimator,
        objective=objective,
        kl_in_reward=kl_in_reward,
        actor=actor,
        ref=ref,
        critic=critic,
        engine=engine,
        checkpoints=CheckpointManager(
            context.run_dir,
            recipe.trainer.max_ckpt_to_keep,
            checksums=recipe.trainer.checkpoint_checksums,
        ),
        total_training_steps=total,
        colocated=colocated,
        old_log_probs_from_update=update_derives_old_log_probs(
            recipe, context.part("training_backends", recipe.actor.backend), estimator
        ),
        placement=placement,
    )
    return parts
