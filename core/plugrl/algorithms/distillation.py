"""The on-policy distillation term of the actor's loss (verl's ``distillation_loss``).

Each sampled token ``y_t`` has the student's log-probability ``s_t = log pi(y_t)`` (with the
gradient) and the teacher's ``t_t = log nu(y_t)`` (scored by the teacher's engine). A
single-sample estimator of the reverse KL, ``KL(pi || nu)``, turns the pair into a per-token
value ``D_t`` (``k1``: ``s_t - t_t``; ``k3``: ``exp(t_t - s_t) - (t_t - s_t) - 1``; the
functions the ``kl_penalties`` registry holds), then either

* ``use_policy_gradient``: ``-D_t`` (no gradient) is token ``t``'s advantage in a clipped
  policy-gradient loss (vanilla PPO at the section's clip ranges). With ``k1`` its expected
  gradient is the reverse KL's own: the "negative reverse KL as a per-token reward" form; or
* otherwise ``D_t`` is the loss itself, backpropagated through ``s_t`` (GKD-style).

Either way the term is aggregated by ``actor.loss_agg_mode`` as this micro-batch's share of the
mini-batch, like every term of :class:`~plugrl.algorithms.objective.PolicyObjective`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

if TYPE_CHECKING:
    from plugrl.parts.algorithm import Aggregate, KLPenalty, PolicyLoss
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe
    from plugrl.recipe.distillation import DistillationLossConfig

TEACHER_LOG_PROBS = "teacher_log_probs"
"""The batch column [B, R] of the teacher's log-probs of the sampled tokens (0 off the
response mask)."""
METRIC_PREFIX = "actor/distillation/"


def distillation_estimates(
    config: DistillationLossConfig,
    penalty: KLPenalty,
    log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
) -> torch.Tensor:
    """``D_t`` [b, R]: the per-token reverse-KL estimate of the section's ``loss_mode``
    (``penalty``), after the ``log_prob_min_clamp`` floor on both log-probs and the
    ``loss_max_clamp`` bound on the result; the gradient flows through ``log_prob``."""
    student, teacher = log_prob, teacher_log_prob.to(log_prob.dtype)
    if config.log_prob_min_clamp is not None:
        student = student.clamp(min=config.log_prob_min_clamp)
        teacher = teacher.clamp(min=config.log_prob_min_clamp)
    estimates = penalty(student, teacher)
    if config.loss_max_clamp is not None:
        # signed estimators (k1) are negative where the teacher likes a token more
        estimates = estimates.clamp(min=-config.loss_max_clamp, max=config.loss_max_clamp)
    return estimates


def distillation_term(
    config: DistillationLossConfig,
    penalty: KLPenalty,
    policy_loss: PolicyLoss | None,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    aggregate: Aggregate,
    importance_weights: torch.Tensor | None = None,
    token_share: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of one micro-batch (a share of the mini-batch's) and its
    metrics, ``actor/distillation/{loss,abs_loss}`` and, for the policy-gradient form, the
    clip fractions of its policy loss under ``actor/distillation/`` (token means over the
    micro-batch, weighed by ``token_share`` into shares of the mini-batch). ``policy_loss``
    is the clipped loss of the policy-gradient form (``None`` for the supervised form)."""
    estimates = distillation_estimates(config, penalty, log_prob, teacher_log_prob)
    metrics: dict[str, float] = {
        METRIC_PREFIX + "abs_loss": float(aggregate(estimates.detach().abs(), response_mask)),
    }
    if config.use_policy_gradient:
        if policy_loss is None:
            raise ValueError("the policy-gradient form of distillation needs its policy loss")
        loss, pg_metrics = policy_loss(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=-estimates.detach(),
            response_mask=response_mask,
            aggregate=aggregate,
            importance_weights=importance_weights,
        )
        for name, value in pg_metrics.items():
            short = name.rpartition("/")[2]
            if short != "pg_loss":  # the term itself is actor/distillation/loss
                metrics[METRIC_PREFIX + short] = float(value) * token_share
    else:
        loss = aggregate(estimates, response_mask)
    metrics[METRIC_PREFIX + "loss"] = float(loss.detach())
    return loss, metrics


def distillation_policy_loss(recipe: Recipe, plugins: PluginManager) -> PolicyLoss:
    """verl's policy loss of the policy-gradient form: ``vanilla`` at the section's clip
    ranges, whatever loss the task's advantages use."""
    from plugrl.plugin.build import build_policy_loss

    loss = recipe.distillation.loss
    actor = attrs.evolve(
        recipe.actor,
        policy_loss="vanilla",
        policy_loss_args={},
        clip_ratio_low=loss.clip_ratio_low,
        clip_ratio_high=loss.clip_ratio_high,
    )
    return build_policy_loss(attrs.evolve(recipe, actor=actor), plugins)


def estimate_stats(
    config: DistillationLossConfig,
    penalty: KLPenalty,
    log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
) -> dict[str, Any]:
    """``actor/distillation/loss_{min,max}`` over a whole batch's response tokens, of the
    estimates at the log-probs the batch was sampled with."""
    estimates = distillation_estimates(config, penalty, log_prob, teacher_log_prob)
    valid = estimates[response_mask.bool()]
    if valid.numel() == 0:
        return {}
    return {
        METRIC_PREFIX + "loss_min": float(valid.min()),
        METRIC_PREFIX + "loss_max": float(valid.max()),
    }
