"""The actor objective: policy loss + KL loss - entropy bonus, with importance weights.

A :class:`PolicyObjective` is built in the driver from a recipe, pickled to the training
workers and called once per micro-batch by the backend. It holds only the recipe and resolves
its parts by name from the registry of the process it runs in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from plugrl.algorithms.functional import LossAggregator, compute_rollout_is_weights
from plugrl.algorithms.training import DERIVED_OLD_LOG_PROBS
from plugrl.data.batch import Batch
from plugrl.errors import DataError, PluginError
from plugrl.parts.algorithm import KLPenalty, LossScale, PolicyLoss
from plugrl.plugin.manager import PluginManager

if TYPE_CHECKING:
    from plugrl.recipe import Recipe

PG_LOSS = "actor/pg_loss"
MASK_METRICS = ("rollout_corr/rollout_is_oob_ratio", "rollout_corr/kpop_masked_fraction")
"""Token means of what IcePop and KPop dropped, reported as shares like the other metrics."""
ROLLOUT_PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"


class PolicyObjective:
    """Implements :class:`plugrl.parts.algorithm.ActorObjective`.

    ``objective(micro_batch, log_prob, entropy, scale) -> (loss, metrics)``: ``micro_batch``
    holds ``old_log_probs``, ``advantages`` and ``response_mask`` [b, R], plus ``ref_log_prob``
    when ``needs_ref``, and ``rollout_is_weights`` or ``rollout_log_probs`` when
    ``algorithm.rollout_is`` is set; ``log_prob`` (and ``entropy`` when ``needs_entropy``)
    [b, R] carry the gradient.

    The loss is ``pg_loss + kl_loss_coef * kl_loss - entropy_coeff * entropy``, each term
    aggregated by ``actor.loss_agg_mode`` as this micro-batch's share of the mini-batch.
    Every metric returned is a share too: summed over the micro-batches of a mini-batch and
    averaged over data-parallel ranks (the reduction the gradient gets) it is the mini-batch
    value.
    """

    def __init__(self, recipe: Recipe, plugins: PluginManager | None = None) -> None:
        self.recipe = recipe
        actor = recipe.actor
        self.needs_entropy = actor.entropy_coeff != 0
        self.needs_ref = actor.use_kl_loss
        self._plugins = plugins
        self._policy_loss: PolicyLoss | None = None
        self._kl_penalty: KLPenalty | None = None
        self.distills = recipe.distillation.enabled
        self._distill_penalty: KLPenalty | None = None
        self._distill_policy_loss: PolicyLoss | None = None

    @classmethod
    def from_recipe(cls, recipe: Recipe, plugins: PluginManager) -> PolicyObjective:
        """Build and resolve once, so that unknown names or bad options fail in the driver."""
        objective = cls(recipe, plugins)
        objective.resolve()
        return objective

    # ------------------------------------------------------------------------ parts

    def attach(self, plugins: PluginManager) -> None:
        """Resolve the parts from ``plugins`` from now on: a worker process attaches its own
        plugin manager to an objective it received (parts do not travel with it)."""
        if plugins is not self._plugins:
            self._plugins = plugins
            self._policy_loss = self._kl_penalty = None
            self._distill_penalty = self._distill_policy_loss = None

    def resolve(self) -> None:
        """Load the policy loss (and KL estimator) from the attached plugin manager."""
        from plugrl.plugin.build import build_policy_loss

        plugins = self._plugins
        if plugins is None:
            raise ValueError(
                "a PolicyObjective resolves its policy loss from a plugin manager: build it "
                "with one, or attach() the process's before use"
            )
        actor = self.recipe.actor
        self._policy_loss = build_policy_loss(self.recipe, plugins)
        if actor.use_kl_loss:
            self._kl_penalty = plugins.registry("kl_penalties").load(actor.kl_loss_type)
        if self.distills:
            from plugrl.algorithms.distillation import distillation_policy_loss

            loss = self.recipe.distillation.loss
            self._distill_penalty = plugins.registry("kl_penalties").load(loss.loss_mode)
            if loss.use_policy_gradient:
                self._distill_policy_loss = distillation_policy_loss(self.recipe, plugins)

    @property
    def policy_loss(self) -> PolicyLoss:
        if self._policy_loss is None:
            self.resolve()
        assert self._policy_loss is not None
        return self._policy_loss

    def __getstate__(self) -> dict[str, Any]:
        # parts are resolved again in the receiving process, from its own plugins
        return {"recipe": self.recipe}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["recipe"])  # type: ignore[misc]

    # ------------------------------------------------------------------------ the loss

    def rows_without_gradient(self, micro_batch: Batch) -> torch.Tensor | None:
        """Rows whose advantages are all zero, when that makes their loss exactly zero: no
        entropy bonus, no KL loss, a policy loss that declares
        :attr:`~plugrl.parts.algorithm.PolicyLoss.zero_at_zero_advantage`, and
        ``actor.skip_zero_advantage_rows`` on. Importance weights multiply the per-token loss,
        so they keep a zero a zero."""
        actor = self.recipe.actor
        if (
            not getattr(actor, "skip_zero_advantage_rows", False)
            or actor.entropy_coeff != 0
            or actor.use_kl_loss
            or self.distills  # the teacher's term has a gradient whatever the advantages
            or not type(self.policy_loss).zero_at_zero_advantage
        ):
            return None
        micro_batch.require("advantages", "response_mask", by="the actor objective")
        valid = micro_batch["response_mask"] != 0
        return ~((micro_batch["advantages"] != 0) & valid).any(dim=-1)

    def importance_weights(self, micro_batch: Batch, dtype: torch.dtype) -> torch.Tensor | None:
        """``rollout_is_weights`` of the batch if a scheduler computed them, else truncated IS
        weights from ``old_log_probs`` and ``rollout_log_probs`` when ``algorithm.rollout_is``
        is set (truncated, or masked by IcePop or KPop), else ``None``."""
        return self._importance_weights(micro_batch, dtype)[0]

    def _importance_weights(
        self, micro_batch: Batch, dtype: torch.dtype
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """:meth:`importance_weights` and, when computed here, the token means over this
        micro-batch of what the masks dropped (IcePop's ``rollout_is_oob_ratio``, KPop's
        ``kpop_masked_fraction``)."""
        if "rollout_is_weights" in micro_batch:
            return micro_batch["rollout_is_weights"].to(dtype), {}
        algorithm = self.recipe.algorithm
        if algorithm.rollout_is is None:
            return None, {}
        if "rollout_log_probs" not in micro_batch:
            raise DataError(
                f"algorithm.rollout_is is {algorithm.rollout_is!r} but the batch has no "
                "rollout_log_probs; use a rollout engine that returns log-probs or set "
                "algorithm.rollout_is=null"
            )
        weights, metrics = compute_rollout_is_weights(
            micro_batch["old_log_probs"].to(dtype),
            micro_batch["rollout_log_probs"],
            micro_batch["response_mask"],
            algorithm.rollout_is,
            algorithm.rollout_is_threshold,
            kpop_threshold=algorithm.kpop_threshold,
        )
        return weights, {name: metrics[name] for name in MASK_METRICS if name in metrics}

    def __call__(
        self,
        micro_batch: Batch,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        scale: LossScale,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        actor = self.recipe.actor
        micro_batch.require(
            "old_log_probs", "advantages", "response_mask", by="the actor objective"
        )
        device, dtype = log_prob.device, log_prob.dtype

        def column(name: str) -> torch.Tensor:
            return micro_batch[name].to(device=device, dtype=dtype)

        mask = column("response_mask")
        aggregate = LossAggregator(actor.loss_agg_mode, scale)
        weights, mask_metrics = self._importance_weights(micro_batch, dtype)
        if weights is not None:
            weights = weights.to(device)
        loss, pg_metrics = self.policy_loss(
            old_log_prob=column("old_log_probs"),
            log_prob=log_prob,
            advantages=column("advantages"),
            response_mask=mask,
            aggregate=aggregate,
            importance_weights=weights,
        )
        # a policy loss reports token means over this micro-batch; weigh them into shares of
        # the sequences the backend ran (all of them, unless it left out zero-loss ones)
        metric_aggregate = LossAggregator(actor.loss_agg_mode, scale.for_metrics())
        share = metric_aggregate.token_share(mask)
        metrics = {
            name: float(value) if name == PG_LOSS else float(value) * share
            for name, value in pg_metrics.items()
        }
        metrics[PG_LOSS] = float(loss.detach())
        if self.distills and not self.recipe.distillation.loss.use_task_rewards:
            # distillation alone trains the actor: the task's policy loss is only logged
            loss = loss.detach() * 0.0
        if weights is not None:
            mean_weight = float((weights * mask).sum()) / max(int((mask != 0).sum()), 1)
            metrics["rollout_corr/rollout_is_mean"] = mean_weight * share
            for name, value in mask_metrics.items():
                metrics[name] = value * share
        if micro_batch.meta.get(DERIVED_OLD_LOG_PROBS) and "rollout_log_probs" in micro_batch:
            # no separate old_log_prob pass compared the engine with the trainer: this forward
            # is on the weights the engine was given, so compare here (the mean only: a
            # backend sums shares over micro-batches, which a max or a spread does not allow)
            engine_probs = torch.exp(column("rollout_log_probs"))
            gap = (engine_probs - torch.exp(log_prob.detach())).abs()
            mean_gap = float((gap * mask).sum()) / max(int((mask != 0).sum()), 1)
            metrics[ROLLOUT_PROBS_DIFF_MEAN] = mean_gap * share

        if actor.entropy_coeff != 0 and entropy is None:
            raise PluginError(
                f"actor.entropy_coeff is {actor.entropy_coeff} but the training backend passed "
                "no entropy to the objective (it must when objective.needs_entropy is true)"
            )
        if entropy is not None:
            entropy_term = aggregate(entropy.to(dtype), mask)
            metrics["actor/entropy"] = float(
                metric_aggregate(entropy.detach().to(dtype), mask)
                if scale.metric_scale is not None
                else entropy_term.detach()
            )
            if actor.entropy_coeff != 0:
                loss = loss - actor.entropy_coeff * entropy_term

        if actor.use_kl_loss:
            if "ref_log_prob" not in micro_batch:
                raise DataError(
                    "actor.use_kl_loss is true but the batch has no ref_log_prob; the "
                    "scheduler must compute reference log-probs (objective.needs_ref)"
                )
            assert self._kl_penalty is not None
            kl_term = aggregate(self._kl_penalty(log_prob, column("ref_log_prob")), mask)
            metrics["actor/kl_loss"] = float(kl_term.detach())
            loss = loss + actor.kl_loss_coef * kl_term
        if self.distills:
            loss = self._add_distillation(
                loss, metrics, micro_batch, log_prob, aggregate, weights, share
            )
        return loss, metrics

    def _add_distillation(
        self,
        loss: torch.Tensor,
        metrics: dict[str, float],
        micro_batch: Batch,
        log_prob: torch.Tensor,
        aggregate: LossAggregator,
        weights: torch.Tensor | None,
        share: float,
    ) -> torch.Tensor:
        """``loss`` with the teacher's term (:mod:`plugrl.algorithms.distillation`): added
        with ``distillation_loss_coef``, or in place of the task's policy loss when
        ``use_task_rewards`` is off."""
        from plugrl.algorithms.distillation import TEACHER_LOG_PROBS, distillation_term

        if TEACHER_LOG_PROBS not in micro_batch:
            raise DataError(
                "distillation.enabled is true but the batch has no teacher_log_probs; the "
                "scheduler must score the responses with the teachers before the update"
            )
        if self._distill_penalty is None:
            self.resolve()
        assert self._distill_penalty is not None
        config = self.recipe.distillation.loss
        device, dtype = log_prob.device, log_prob.dtype
        term, term_metrics = distillation_term(
            config,
            self._distill_penalty,
            self._distill_policy_loss,
            log_prob=log_prob,
            old_log_prob=micro_batch["old_log_probs"].to(device=device, dtype=dtype),
            teacher_log_prob=micro_batch[TEACHER_LOG_PROBS].to(device=device, dtype=dtype),
            response_mask=micro_batch["response_mask"].to(device=device, dtype=dtype),
            aggregate=aggregate,
            importance_weights=weights,
            token_share=share,
        )
        metrics.update(term_metrics)
        coef = config.distillation_loss_coef if config.use_task_rewards else 1.0
        return loss + coef * term
