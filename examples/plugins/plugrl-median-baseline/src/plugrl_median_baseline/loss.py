"""PPO's clipped surrogate with clipped advantages."""

from __future__ import annotations

import torch

from plugrl.api.algorithms import Aggregate, PolicyLoss, masked_mean

from .options import RobustPPOConfig

LOG_RATIO_CLAMP = 20.0


class RobustPPO(PolicyLoss):
    """PPO's clipped surrogate (``actor.clip_ratio_low/high``, dual clip at
    ``actor.clip_ratio_c``) of advantages clipped to ``[-max_advantage, max_advantage]``.

    Metrics, token means over the micro-batch's valid tokens (the objective weighs them into
    the mini-batch's value): ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
    ``actor/ppo_kl`` as verl names them, and ``actor/adv_clipfrac``, the share of tokens whose
    advantage was clipped.
    """

    @property
    def options(self) -> RobustPPOConfig:
        # built without options (a test, or a recipe that sets none): the defaults
        return self.args if isinstance(self.args, RobustPPOConfig) else RobustPPOConfig()

    def __call__(
        self,
        *,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        aggregate: Aggregate,
        importance_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        options = self.options
        low, high = self.config.effective_clip_low, self.config.effective_clip_high
        clipped_advantages = advantages.clamp(-options.max_advantage, options.max_advantage)
        log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        unclipped = -clipped_advantages * ratio
        clipped = -clipped_advantages * torch.clamp(ratio, 1 - low, 1 + high)
        losses = torch.maximum(unclipped, clipped)
        negative = clipped_advantages < 0
        dual_bound = -clipped_advantages * self.config.clip_ratio_c
        if options.dual_clip:
            losses = torch.where(negative, torch.minimum(dual_bound, losses), losses)
        if importance_weights is not None:
            losses = losses * importance_weights.detach().to(losses.dtype)
        loss = aggregate(losses, response_mask)
        with torch.no_grad():
            dtype = log_prob.dtype
            lower = (torch.maximum(unclipped, clipped) > dual_bound) & negative
            if not options.dual_clip:
                lower = torch.zeros_like(lower)
            metrics = {
                "actor/pg_loss": float(loss.detach()),
                "actor/pg_clipfrac": float(
                    masked_mean((clipped > unclipped).to(dtype), response_mask)
                ),
                "actor/pg_clipfrac_lower": float(masked_mean(lower.to(dtype), response_mask)),
                "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
                "actor/adv_clipfrac": float(
                    masked_mean((advantages.abs() > options.max_advantage).to(dtype), response_mask)
                ),
            }
        return loss, metrics
