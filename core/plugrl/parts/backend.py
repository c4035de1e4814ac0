"""Training backends: hold the model shards of one rank and turn batches into updates."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.config import PackageNeed, fraction, non_negative, option, positive, section
from plugrl.parts.algorithm import PolicyLossConfig
from plugrl.parts.context import DistInfo, PartContext, Role

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from plugrl.data.batch import Batch
    from plugrl.parts.algorithm import ActorObjective
    from plugrl.parts.rollout import WeightMeta
    from plugrl.recipe import Recipe


@attrs.define(kw_only=True)
class OptimConfig:
    """``actor.optim`` / ``critic.optim``: AdamW and its learning-rate schedule."""

    lr: float = option(
        1e-6, "Peak learning rate.", verl="actor_rollout_ref.actor.optim.lr", validator=positive
    )
    weight_decay: float = option(
        0.01,
        "AdamW weight decay.",
        verl="actor_rollout_ref.actor.optim.weight_decay",
        validator=non_negative,
    )
    betas: list[float] = option(
        factory=lambda: [0.9, 0.999],
        help="AdamW betas.",
        verl="actor_rollout_ref.actor.optim.betas",
    )
    lr_warmup_steps: int = option(
        -1,
        "Linear warm-up steps; -1 uses lr_warmup_steps_ratio.",
        verl="actor_rollout_ref.actor.optim.lr_warmup_steps",
    )
    lr_warmup_steps_ratio: float = option(
        0.0,
        "Warm-up as a fraction of the total training steps.",
        verl="actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
        validator=fraction,
    )
    lr_scheduler_type: str = option(
        "constant",
        "Schedule after warm-up.",
        choices=["constant", "cosine"],
        verl="actor_rollout_ref.actor.optim.lr_scheduler_type",
    )
    min_lr_ratio: float = option(
        0.0,
        "Cosine schedule floor as a fraction of lr.",
        verl="actor_rollout_ref.actor.optim.min_lr_ratio",
        validator=fraction,
    )


@attrs.define(kw_only=True)
class ActorConfig(PolicyLossConfig):
    """The ``actor`` section. The chosen backend's config class extends this one, so its own
    keys (``actor.fsdp_size``, ``actor.tensor_model_parallel_size``...) sit beside these; the
    keys of the actor's loss (``actor.clip_ratio_high``, ``actor.loss_agg_mode``...) come from
    :class:`~plugrl.parts.algorithm.PolicyLossConfig`."""

    backend: str = option(
        "fsdp2",
        "Training backend.",
        verl="actor_rollout_ref.actor.strategy",
        registry="training_backends",
    )
    ppo_mini_batch_size: int = option(
        256,
        "Prompts per optimizer step (each brings rollout.n responses).",
        verl="actor_rollout_ref.actor.ppo_mini_batch_size",
        validator=positive,
    )
    ppo_micro_batch_size_per_gpu: int | None = option(
        None,
        "Sequences per forward/backward on one rank (gradient accumulation); unset: "
        "the whole mini-batch share of the rank.",
        verl="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        validator=positive,
    )
    use_dynamic_bsz: bool = option(
        False,
        "Pack micro-batches by token budget (ppo_max_token_len_per_gpu) instead of count.",
        verl="actor_rollout_ref.actor.use_dynamic_bsz",
    )
    ppo_max_token_len_per_gpu: int = option(
        16384,
        "Token budget of one micro-batch when use_dynamic_bsz is on.",
        verl="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        validator=positive,
    )
    log_prob_micro_batch_size_per_gpu: int | None = option(
        None,
        "Sequences per forward when computing old/ref log-probs; unset: as for training.",
        verl="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        validator=positive,
    )
    ppo_epochs: int = option(
        1,
        "Passes over each batch of rollouts.",
        verl="actor_rollout_ref.actor.ppo_epochs",
        validator=positive,
    )
    shuffle: bool = option(
        False, "Shuffle samples between mini-batches.", verl="actor_rollout_ref.actor.shuffle"
    )
    reuse_on_policy_log_prob: bool = option(
        True,
        "When an update is one optimizer step over the whole batch (ppo_epochs 1, one "
        "mini-batch) and nothing reads old log-probs before it, take them from the update's "
        "own forward (detached) and skip the separate old_log_prob pass; false always runs it.",
    )
    skip_zero_advantage_rows: bool = option(
        True,
        "Leave out of the update's forward and backward the sequences whose advantages are "
        "all zero (a GRPO group whose responses scored alike), when the actor loss is then "
        "exactly zero for them: no entropy bonus, no KL loss, and a policy loss that says so. "
        "The gradient is the same; actor/entropy, pg_clipfrac and ppo_kl become means over "
        "the sequences trained. false runs every sequence.",
    )
    grad_clip: float = option(
        1.0,
        "Gradient-norm clip; 0 disables.",
        verl="actor_rollout_ref.actor.grad_clip",
        validator=non_negative,
    )
    optim: OptimConfig = section(OptimConfig, "Optimizer.", verl="actor_rollout_ref.actor.optim")

    supports_lora: ClassVar[bool] = False
    """Whether the backend trains LoRA adapters (``model.lora_rank``): a recipe that asks for
    them with another backend is refused when it is read. Such a backend implements
    :meth:`TrainingBackend.compute_ref_log_prob`."""

    sends_lora_adapters: ClassVar[bool] = False
    """Whether the backend, training LoRA adapters, can send the engines the adapters alone
    (``rollout.lora_sync=adapters``): :meth:`TrainingBackend.named_weights` then yields the
    factors of each adapter (:data:`plugrl.parts.rollout.ADAPTER_FACTORS`) and no other
    weight."""

    def packages_needed(self, recipe: Recipe) -> list[PackageNeed]:
        """Optional packages that this backend needs for ``recipe``'s settings (LoRA's, say);
        the recipe is refused when it is read if one is missing. None by default."""
        return []

    def mini_batch_rows(self, n: int) -> int:
        """Sequences per optimizer step over all ranks: ``ppo_mini_batch_size x rollout.n``."""
        return self.ppo_mini_batch_size * n

    def data_parallel_size(self, ranks: int) -> int:
        """The data-parallel ranks among ``ranks`` ranks of a role: the ranks a mini-batch is
        split over. Here every rank holds a whole copy of the model, so all of them; a backend
        whose config splits a model over several ranks (tensor, pipeline or context
        parallelism) overrides this, raising a :class:`~plugrl.errors.RecipeError` when
        ``ranks`` does not divide into whole model copies."""
        return ranks

    def sequence_parallel_size(self) -> int:
        """Ranks each sequence of a micro-batch is split over. ``ppo_max_token_len_per_gpu``
        counts the tokens of one rank, so a micro-batch holds up to that many times this; 1
        here, a backend that splits sequences overrides it."""
        return 1


@attrs.define(kw_only=True)
class CriticConfig:
    """The ``critic`` section: a value model, used by estimators that need values (gae)."""

    enable: bool | None = option(
        None,
        "Train a critic; unset: on exactly when the advantage estimator needs values.",
        verl="critic.enable",
    )
    model_path: str | None = option(
        None, "Initial weights; unset: model.path.", verl="critic.model.path", path="model"
    )
    ppo_micro_batch_size_per_gpu: int | None = option(
        None,
        "Sequences per forward/backward on one rank.",
        verl="critic.ppo_micro_batch_size_per_gpu",
        validator=positive,
    )
    ppo_epochs: int | None = option(
        None,
        "Passes per batch; unset: actor.ppo_epochs.",
        verl="critic.ppo_epochs",
        validator=positive,
    )
    cliprange_value: float = option(
        0.5,
        "Value clip range of the value loss.",
        verl="critic.cliprange_value",
        validator=non_negative,
    )
    grad_clip: float = option(
        1.0, "Gradient-norm clip; 0 disables.", verl="critic.grad_clip", validator=non_negative
    )
    optim: OptimConfig = option(
        factory=lambda: OptimConfig(lr=1e-5), help="Optimizer.", verl="critic.optim"
    )


class TrainingBackend(ABC):
    """One rank of a training framework (FSDP2, Megatron) for one role.

    Built in each worker process after the process group is initialised; the cluster layer
    splits batches across data-parallel ranks and gathers results, so every method here sees
    only this rank's share. Tensors in and out are on CPU; the backend moves them.

    Built as ``Backend(config, context)``: ``config`` is the ``actor`` section read into the
    backend's config class (it holds the settings of every role the backend builds);
    ``context.role``, ``context.device`` and ``context.dist`` say which rank of which model
    this is, ``context.recipe`` the whole run (``model``, ``critic``, ``data``).

    Batch columns it reads (verl names): ``input_ids``, ``attention_mask``, ``position_ids``
    [B, P+R]; ``responses``, ``response_mask`` [B, R]; for updates also ``old_log_probs``,
    ``advantages``, optionally ``ref_log_prob``, ``rollout_log_probs``, ``returns``, ``values``.
    """

    supports_colocated_rollout: ClassVar[bool] = False
    """True when :meth:`rollout_model` can hand the live model to an in-process engine."""
    derives_on_policy_old_log_probs: ClassVar[bool] = False
    """True when :meth:`update_policy` accepts a batch without ``old_log_probs`` whose update
    is a single optimizer step (one epoch, one mini-batch), and then uses the detached
    log-probs of its own forward as ``old_log_probs``: the weights that forward sees are the
    ones a separate :meth:`compute_log_prob` pass would have used."""
    computes_sum_pi_squared: ClassVar[bool] = False
    """True when :meth:`compute_log_prob` returns ``sum_pi_squared`` when asked
    (``calculate_sum_pi_squared=True``), which the optimal token baseline reads; a run whose
    estimator needs it stops at start-up with a backend that does not."""

    def __init__(self, config: ActorConfig, context: PartContext) -> None:
        if context.role is None or context.device is None:
            raise ValueError("a training backend is built with context.role and context.device")
        self.config = config
        self.context = context
        self.recipe = context.recipe
        self.role: Role = context.role
        self.device = context.device
        self.dist: DistInfo = context.dist

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index (differs from ``dist.rank`` under TP/PP)."""
        return self.dist.rank

    @property
    def dp_size(self) -> int:
        return self.dist.world_size

    @property
    def is_output_rank(self) -> bool:
        """Whether this rank's results are its data-parallel shard's: with tensor or pipeline
        parallelism only one rank of each data-parallel group holds the outputs (the first
        tensor-parallel rank of the last pipeline stage); the worker group collects from it."""
        return True

    @abstractmethod
    def setup(self, total_training_steps: int) -> None:
        """Build the model (and, for actor/critic, optimizer and LR schedule)."""

    @abstractmethod
    def compute_log_prob(
        self, batch: Batch, *, calculate_entropy: bool = False
    ) -> dict[str, torch.Tensor]:
        """Per-token log-probs of ``responses`` under the current weights, no gradient.

        Returns ``{"log_probs": [B, R]}`` plus ``{"entropys": [B, R]}`` when asked.

        A backend that declares :attr:`computes_sum_pi_squared` also takes the keyword
        ``calculate_sum_pi_squared: bool = False`` and then adds ``{"sum_pi_squared": [B, R]}``
        (``sum_v p_v^2`` of each position's whole distribution,
        :func:`plugrl.algorithms.training.response_sum_pi_squared`). The caller passes it only
        to such a backend and only when true, so the others need not take it.
        """

    def compute_ref_log_prob(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Reference log-probs ``{"log_probs": [B, R]}`` from the actor itself: the model it
        started from, which a LoRA actor still holds under its adapters. Called on the actor
        role instead of building a reference model when ``model.lora_rank`` is set (a backend
        whose config has :attr:`ActorConfig.supports_lora` must implement it)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapters")

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Per-token values [B, R] (critic role only)."""
        raise NotImplementedError(f"{type(self).__name__} has no critic")

    @abstractmethod
    def update_policy(self, batch: Batch, objective: ActorObjective) -> dict[str, float]:
        """Run ``ppo_epochs`` over ``batch`` in mini-batches of ``ppo_mini_batch_size`` (x n),
        each split into micro-batches; backward ``objective``'s loss; clip; step.

        A backend with :attr:`derives_on_policy_old_log_probs` also takes a batch without
        ``old_log_probs`` when the update is one optimizer step; it then reports
        ``actor/entropy`` too, which the skipped pass would have given.

        Returns metrics averaged over steps (``actor/pg_loss``, ``actor/grad_norm``,
        ``actor/lr``, ...).
        """

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Value-function update (critic role only); returns ``critic/*`` metrics."""
        raise NotImplementedError(f"{type(self).__name__} has no critic")

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights in Hugging Face names, one at a time, in the dtype engines
        receive them in.

        Collective: every rank must run the iterator to its end; only the ranks that hold
        weights to send (rank 0 for FSDP) yield tensors.
        """

    def weight_metadata(self) -> list[WeightMeta]:
        """Name, full shape and dtype of every weight :meth:`named_weights` yields, in that
        order, without gathering anything (engines check a whole update against it before the
        first tensor arrives). Same answer on every rank."""
        raise NotImplementedError(f"{type(self).__name__} does not describe its weights")

    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """:meth:`named_weights` in buckets of at most ``bucket_bytes`` (a larger weight
        travels alone). Collective, like :meth:`named_weights`; ranks that yield no weights
        yield no buckets."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self.named_weights():
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket

    def rollout_model(self) -> Any:
        """The live model for a colocated in-process rollout engine (no copy), or ``None``."""
        return None

    @abstractmethod
    def save_checkpoint(self, path: Path) -> None:
        """Write this rank's model, optimizer, LR schedule and RNG state under ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote; a missing or corrupt file raises
        :class:`plugrl.errors.CheckpointError` naming it."""

    @abstractmethod
    def export_hf(self, path: Path) -> None:
        """Write a Hugging Face folder (config, safetensors, tokenizer) that vLLM can serve.

        Collective; rank 0 writes.
        """

    def close(self) -> None:
        """Release the model and its memory."""
