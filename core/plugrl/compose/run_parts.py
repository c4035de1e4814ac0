"""What every scheduler builds before its loop: tokenizer, data, reward, algorithm pieces, the
backend worker groups, the engine group and the weight transport between them, resolved from
the recipe and checked up front so that a bad recipe or bad data fails before the first
generation."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.cluster.services import RunServices
from plugrl.errors import RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import Capability, check_capabilities
from plugrl.state import rng
from plugrl.state.checkpoint import CheckpointManager

if TYPE_CHECKING:
    from pathlib import Path

    from plugrl.agents.session import AgentRuntime
    from plugrl.algorithms.kl_in_reward import KLInReward
    from plugrl.algorithms.objective import PolicyObjective
    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.engines import EngineGroup
    from plugrl.compose.teachers import Teachers
    from plugrl.data.batch import Batch
    from plugrl.data.dataset import PromptDataset, PromptLoader
    from plugrl.data.multimodal import MultimodalData
    from plugrl.parts.algorithm import AdvantageEstimator
    from plugrl.parts.device import Device
    from plugrl.parts.reward import RewardManager
    from plugrl.parts.transport import WeightTransport
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe
    from plugrl.run.runner import RunContext

logger = logging.getLogger("plugrl.run")

# ``rollout.weight_transport: auto`` takes the first of these that can connect the trainer and
# the engines; the collective is skipped on cpu, where the object store is as fast and simpler
AUTO_TRANSPORTS = ("local", "collective", "object_store")


@attrs.define
class RunParts:
    """The built parts of a run, shared by the schedulers."""

    recipe: Recipe
    plugins: PluginManager
    """The run's plugin manager (the driver's)."""
    device: Device
    tokenizer: Any
    pad_token_id: int
    train_data: PromptDataset
    val_data: PromptDataset | None
    train_loader: PromptLoader
    reward: RewardManager
    estimator: AdvantageEstimator
    objective: PolicyObjective
    kl_in_reward: KLInReward | None
    actor: WorkerGroup
    ref: WorkerGroup | None
    critic: WorkerGroup | None
    engines: EngineGroup
    transport: WeightTransport | None
    """How weights reach the engines; ``None`` when the engine generates with the actor's
    own model in this process (:attr:`shares_model`)."""
    checkpoints: CheckpointManager
    total_training_steps: int
    shares_model: bool = False
    ref_in_actor: bool = False
    """The actor computes the reference log-probs itself (its LoRA adapters off), so there is
    no ref role (see :meth:`~plugrl.parts.backend.TrainingBackend.compute_ref_log_prob`)."""
    engines_sleep: bool = False
    """The engines share the trainer's devices and sleep while it trains
    (``rollout.free_cache_engine``)."""
    old_log_probs_from_update: bool = False
    """The update is exactly on-policy and derives ``old_log_probs`` from its own forward, so
    the scheduler skips the separate pass (see :func:`update_derives_old_log_probs`)."""
    weight_version: int = 0
    placement: Any = None
    """The Ray devices the roles share (:class:`plugrl.cluster.ray_group.RayPlacement`), or
    ``None``."""
    multimodal: MultimodalData | None = None
    """The vision-language model's processing (family, processor), ``None`` for a text
    model."""
    agents: AgentRuntime | None = None
    """The agent loops, tools and their event loop, built by :meth:`agent_runtime` on the
    first batch whose rows need an agent loop other than ``single_turn``."""
    teachers: Teachers | None = None
    """The frozen teachers of on-policy distillation (``distillation.enabled``), or
    ``None``."""

    def with_model_positions(self, batch: Batch) -> Batch:
        """``batch`` (just built from generated responses) with the model's own position ids
        over prompt and response when its rows carry images (M-RoPE for Qwen2-VL); a text
        batch unchanged."""
        from plugrl.data.multimodal import add_model_positions

        family = self.multimodal.family if self.multimodal is not None else None
        return add_model_positions(batch, family)

    def agent_runtime(self) -> AgentRuntime:
        """The run's :class:`~plugrl.agents.session.AgentRuntime`, built on first use."""
        if self.agents is None:
            from plugrl.agents.session import AgentRuntime

            self.agents = AgentRuntime(
                self.recipe, self.plugins, self.tokenizer, self.engines, self.multimodal
            )
        return self.agents

    # ------------------------------------------------------------------------- weights

    def sync_weights(self) -> dict[str, float]:
        """Give the engines the actor's current weights as :attr:`weight_version`; returns
        the transport's metrics (none when the engine shares the actor's model)."""
        if self.shares_model:
            self.engines.bind_model(self.actor.rollout_model(), self.weight_version)
            metrics: dict[str, float] = {}
        else:
            assert self.transport is not None
            if self.engines_sleep:
                self.engines.wake_up(["weights"])
            metrics = self.transport.push(self.actor, self.engines, self.weight_version)
            if self.engines_sleep:
                self.engines.wake_up(["kv_cache"])
        if self.recipe.trainer.verify_weight_sync:
            metrics["training/weight_sync_verified_weights"] = self.verify_weight_sync()
        return metrics

    def verify_weight_sync(self) -> int:
        """Compare every engine's fingerprints of the weights with the trainer's
        (:func:`plugrl.cluster.weight_check.verify_fingerprints`); one line naming the engine and
        the weight when they differ. Returns the number of weights compared."""
        import torch

        from plugrl.cluster.weight_check import verify_fingerprints

        dtype = getattr(torch, self.recipe.rollout.resolved_dtype(self.device))
        return verify_fingerprints(self.actor, self.engines, dtype, self.weight_version)

    def resync_engines(self, indices: list[int]) -> None:
        """Give restarted engines the current weights (the engine group calls this)."""
        assert self.transport is not None
        self.transport.push(self.actor, self.engines, self.weight_version, engine_indices=indices)

    def before_training(self) -> None:
        """Free the engines' device memory for training when they share the devices."""
        if self.engines_sleep:
            self.engines.sleep(level=1)

    # ------------------------------------------------------------------------- checkpoints

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
            "rng": rng.capture(),
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
        rng.restore(state["rng"])
        logger.info("resumed from %s (step %d)", path, state["step"])
        return state

    def close(self) -> None:
        for closer in (
            *([self.agents.close] if self.agents is not None else []),
            *([self.teachers.close] if self.teachers is not None else []),
            self.engines.close,
            self.reward.close,
            *(group.close for group in self.groups().values()),
            *([self.placement.close] if self.placement is not None else []),
        ):
            try:
                closer()
            except Exception as exc:  # closing must not hide the error that ended the run
                logger.warning("closing %s failed: %s", closer, exc)


# --------------------------------------------------------------------------------------------
# Pieces of the composition, usable on their own
# --------------------------------------------------------------------------------------------


def training_loader(recipe: Recipe, dataset: PromptDataset, pad_token_id: int) -> PromptLoader:
    """The loader of training prompts: ``data.train_batch_size`` per batch, or with dynamic
    sampling ``data.gen_batch_size`` per generation round when set."""
    from plugrl.data.dataset import PromptLoader

    data = recipe.data
    # without dynamic sampling gen_batch_size is ignored (the recipe check warns about it)
    per_round = recipe.algorithm.filter_groups.enable and data.gen_batch_size is not None
    return PromptLoader.for_training(dataset, data, pad_token_id, per_generation_round=per_round)


def check_data_sources(
    reward: RewardManager,
    datasets: list[PromptDataset | None],
    environment: str | None = None,
) -> None:
    """Fail before any generation when a data source has no scorer, naming the first row
    that uses it (the reward's own message says how to add one). In a run with an
    ``environment``, whose episode rewards need no scorer, it is a warning: a trajectory that
    gives no reward of its own then stops the run when its batch is scored."""
    from plugrl.errors import DataError

    first_row: dict[str, str] = {}
    for dataset in datasets:
        for record in dataset.records if dataset is not None else []:
            first_row.setdefault(record.data_source, record.origin)
    for data_source, origin in sorted(first_row.items()):
        try:
            reward.check_data_sources([data_source])
        except DataError as exc:
            if environment is None:
                raise DataError(f"{origin}: {exc}") from None
            logger.warning(
                "%s: %s; the run relies on the episode rewards of environment %r for these rows",
                origin,
                exc,
                environment,
            )


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


def build_reward_manager(
    recipe: Recipe, tokenizer: Any, plugins: PluginManager, device: Device | None = None
) -> RewardManager:
    """The reward manager ``reward.manager`` names, or with ``reward.components`` the weighted
    sum of the components' managers, given the driver's ``device`` (where a reward model
    runs). Call its ``check_data_sources`` with the data's ``data_source`` values before
    generating, and ``close()`` at the end of the run."""
    from plugrl.plugin.build import build_part

    if recipe.reward.components:
        from plugrl.rewards.components import WeightedRewardComponents

        return WeightedRewardComponents.build(
            recipe,
            tokenizer,
            plugins,
            lambda name, config, context: build_part("reward_managers", name, config, context),
            device=device,
        )
    context = PartContext(
        recipe=recipe, plugins=plugins, tokenizer=tokenizer, device=device, services=RunServices()
    )
    return build_part("reward_managers", recipe.reward.manager, recipe.reward, context)


def choose_transport(
    recipe: Recipe,
    actor: WorkerGroup,
    engines: EngineGroup,
    *,
    device: Device,
    plugins: PluginManager,
) -> WeightTransport:
    """The transport ``rollout.weight_transport`` names, or for ``auto`` the first built-in
    one that can connect ``actor`` and ``engines``; one line when the named one cannot."""
    from plugrl.plugin.build import build_part

    registry = plugins.registry("weight_transports")
    chosen = recipe.rollout.weight_transport
    context = PartContext(recipe=recipe, plugins=plugins, device=device)
    if chosen != "auto":
        reason = registry.load(chosen).unusable_reason(actor, engines)
        if reason is not None:
            raise RecipeError(
                f"transport {chosen!r} cannot be used here: {reason}",
                key="rollout.weight_transport",
            )
        names = [chosen]
    else:
        names = [
            name
            for name in AUTO_TRANSPORTS
            if name in registry
            and registry.get(name).available
            and not (name == "collective" and device.torch_device_type == "cpu")
            and registry.load(name).unusable_reason(actor, engines) is None
        ]
    if names:
        logger.info("the engines get the actor's weights through the %r transport", names[0])
        return build_part("weight_transports", names[0], recipe.rollout, context)
    raise RecipeError(
        "no installed weight transport connects the trainer and the engines here; install "
        "the ray extra (pip install 'plugrl[ray]') or name one",
        key="rollout.weight_transport",
    )


# --------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------


def build_run_parts(context: RunContext, engine_needs: dict[str, str] | None = None) -> RunParts:
    """Build and check everything a run needs, in the order that fails cheapest first.

    ``engine_needs`` maps the engine capabilities the scheduler needs to the reason (see
    :attr:`Scheduler.engine_needs <plugrl.parts.scheduler.Scheduler.engine_needs>`).
    """
    from plugrl.algorithms.checks import check_algorithm
    from plugrl.algorithms.kl_in_reward import KLInReward
    from plugrl.algorithms.objective import PolicyObjective
    from plugrl.cluster.engines import make_engine_group
    from plugrl.cluster.groups import make_placement, make_worker_group
    from plugrl.cluster.ray_group import check_cluster_paths, check_ray_installed
    from plugrl.cluster.worker import build_device
    from plugrl.data.dataset import PromptDataset, load_tokenizer, pad_token_id_of
    from plugrl.data.multimodal import load_multimodal
    from plugrl.plugin.build import build_estimator, check_constructor

    recipe, plugins = context.recipe, context.plugins
    check_ray_installed(recipe)
    check_algorithm(recipe, plugins)
    engine_entry = plugins.registry("rollout_engines").get(recipe.rollout.engine)
    engine_cls = engine_entry.load()
    backend_entry = plugins.registry("training_backends").get(recipe.actor.backend)
    # in the driver, before any worker starts: a class that does not fit fails here, once
    check_constructor(engine_entry, engine_cls)
    check_constructor(backend_entry, backend_entry.load())
    needs = {Capability(name): reason for name, reason in (engine_needs or {}).items()}
    check_capabilities(recipe.rollout.engine, engine_cls, needs)
    device = build_device(plugins, context.device_name, recipe)
    rng.seed_all(recipe.trainer.seed, device)

    tokenizer = load_tokenizer(recipe.model)
    pad_token_id = pad_token_id_of(tokenizer)
    multimodal = load_multimodal(recipe.model, tokenizer, plugins)
    train_data = PromptDataset.train(recipe.data, tokenizer, multimodal)
    val_data = PromptDataset.validation(recipe.data, tokenizer, multimodal)
    if train_data.has_images:
        check_capabilities(
            recipe.rollout.engine, engine_cls, {Capability.IMAGES: "data with images"}
        )
    train_loader = training_loader(recipe, train_data, pad_token_id)
    reward = build_reward_manager(recipe, tokenizer, plugins, device)
    check_data_sources(reward, [train_data, val_data], recipe.rollout.agent.env)

    estimator = build_estimator(recipe, plugins)
    objective = PolicyObjective.from_recipe(recipe, plugins)
    algorithm = recipe.algorithm
    kl_in_reward = KLInReward.from_recipe(recipe, plugins) if algorithm.use_kl_in_reward else None
    total = recipe.trainer.total_training_steps or len(train_loader) * recipe.trainer.total_epochs

    needs_ref = recipe.actor.use_kl_loss or algorithm.use_kl_in_reward
    # a LoRA actor holds the reference model under its adapters: no second copy
    ref_in_actor = needs_ref and recipe.model.lora_rank > 0
    needs_ref = needs_ref and not ref_in_actor
    needs_values = "values" in estimator.requires
    critic_on = recipe.critic.enable if recipe.critic.enable is not None else needs_values
    on_ray_colocated = recipe.cluster.mode == "ray" and recipe.rollout.colocate
    roles = [
        "actor",
        *(["ref"] if needs_ref else []),
        *(["critic"] if critic_on else []),
        *(["rollout"] if on_ray_colocated else []),
    ]
    built: list[Any] = [reward]
    placement = None
    teachers = None

    def group(role: str) -> WorkerGroup:
        made = make_worker_group(
            recipe, role, device_name=context.device_name, plugins=plugins, placement=placement
        )
        built.append(made)
        made.setup(total)
        return made

    try:
        if recipe.cluster.mode == "ray":
            # before any worker starts: the other nodes see the files the driver resolved
            check_cluster_paths(recipe, plugins, context.run_dir)
        # on Ray the roles share the devices: rank i of each role on the i-th device
        placement = make_placement(recipe, roles, device_name=context.device_name, plugins=plugins)
        if placement is not None:
            built.append(placement)
        if recipe.distillation.enabled:
            from plugrl.compose.teachers import Teachers

            teachers = Teachers(recipe, plugins, tokenizer, device)
            built.append(teachers)
        actor = group("actor")
        ref = group("ref") if needs_ref else None
        critic = group("critic") if critic_on else None
        shares_model = (
            recipe.rollout.colocate
            and Capability.SHARE_MODEL in engine_cls.capabilities
            and actor.rollout_model() is not None
        )
        engines = make_engine_group(
            recipe,
            device_name=context.device_name,
            plugins=plugins,
            trainer_placement=placement,
            model_from_trainer=shares_model,
        )
        built.append(engines)
        transport = None
        if not shares_model:
            check_capabilities(
                recipe.rollout.engine,
                engine_cls,
                {Capability.WEIGHT_UPDATE: "an engine that does not share the trainer's model"},
            )
            transport = choose_transport(recipe, actor, engines, device=device, plugins=plugins)
    except BaseException:
        for part in reversed(built):  # no Ray actor or scoring worker outlives a failed start
            try:
                part.close()
            except Exception as exc:
                logger.warning("closing %s after a failed start failed: %s", part, exc)
        raise
    parts = RunParts(
        recipe=recipe,
        plugins=plugins,
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
        engines=engines,
        transport=transport,
        checkpoints=CheckpointManager(
            context.run_dir,
            recipe.trainer.max_ckpt_to_keep,
            checksums=recipe.trainer.checkpoint_checksums,
        ),
        total_training_steps=total,
        shares_model=shares_model,
        ref_in_actor=ref_in_actor,
        engines_sleep=(
            on_ray_colocated
            and recipe.rollout.free_cache_engine
            and Capability.SLEEP in engines.capabilities
        ),
        old_log_probs_from_update=update_derives_old_log_probs(
            recipe, context.part("training_backends", recipe.actor.backend), estimator
        ),
        placement=placement,
        multimodal=multimodal,
        teachers=teachers,
    )
    if transport is not None:
        engines.on_restart = parts.resync_engines
    return parts
