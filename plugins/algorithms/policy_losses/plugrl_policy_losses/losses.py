"""Policy losses over one micro-batch.

Each loss builds a per-token loss matrix, multiplies it by the importance weights when given,
and reduces it with the ``aggregate`` it is handed (the micro-batch's share of the global
mini-batch, see :class:`plugrl.algorithms.functional.LossAggregator`). It returns the loss and
its metrics: ``actor/pg_loss`` (the returned loss, itself a share) and the token means over the
micro-batch's valid tokens ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower`` and
``actor/ppo_kl`` (``mean(old_log_prob - log_prob)``). Formulas: docs/algorithms.md.

Where the log ratio ``log_prob - old_log_prob`` is bounded follows verl 0.9.1's
``core_algos.py`` loss by loss, so that every loss gives verl's numbers (the tests hold each
to them), extreme ratios included:

* ``vanilla``, ``cispo`` and ``sapo`` clamp it to ±20 before ``exp``, as verl does: the ratio would
  overflow to ``inf`` for a token whose log-prob moved by more than about 88, and the clipped
  surrogate takes the ratio itself;
* ``gspo`` caps the sequence-level log ratio at 10 (from above only), as verl does;
* ``geo_mean`` clips it per token to ``[-clip_ratio_low, clip_ratio_high]`` in log space as
  part of its formula, so it needs no other bound (verl leaves the ±20 clamp commented out);
* ``clip_cov`` and ``kl_cov`` take it unbounded, as verl does: ``clip_cov``'s PPO clip and
  ``kl_cov``'s ``|log ratio|`` penalty are verl's formulas on the raw ratio, and a bound would
  change which tokens count as clipped or penalised;
* ``reinforce`` uses no ratio.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from plugrl.api.algorithms import Aggregate, PolicyLoss, masked_mean

from .options import ClipCovArgs, KLCovArgs, SapoArgs

LOG_RATIO_CLAMP = 20.0
"""verl's bound on the token log ratio of the losses that clamp it (see the module doc)."""
GSPO_LOG_RATIO_MAX = 10.0
"""verl's cap on GSPO's sequence log ratio."""


def _metrics(
    loss: torch.Tensor,
    clipfrac: torch.Tensor | float,
    clipfrac_lower: torch.Tensor | float,
    ppo_kl: torch.Tensor,
) -> dict[str, float]:
    return {
        "actor/pg_loss": float(loss.detach()),
        "actor/pg_clipfrac": float(clipfrac),
        "actor/pg_clipfrac_lower": float(clipfrac_lower),
        "actor/ppo_kl": float(ppo_kl.detach()),
    }


def _weighted(losses: torch.Tensor, importance_weights: torch.Tensor | None) -> torch.Tensor:
    if importance_weights is None:
        return losses
    return losses * importance_weights.detach().to(losses.dtype)


class _ClippedLoss(PolicyLoss):
    name: ClassVar[str] = ""

    @property
    def clip_low(self) -> float:
        return self.config.effective_clip_low

    @property
    def clip_high(self) -> float:
        return self.config.effective_clip_high


class VanillaPPO(_ClippedLoss):
    """PPO's clipped surrogate with asymmetric clip range and dual clip for A < 0."""

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "vanilla"
    uses_dual_clip: ClassVar[bool] = True

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
        # clamped as verl's vanilla loss clamps it: exp of an unbounded log ratio overflows
        log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high)
        clipped_max = torch.maximum(unclipped, clipped)
        dual_bound = -advantages * self.config.clip_ratio_c
        negative = advantages < 0
        losses = torch.where(negative, torch.minimum(dual_bound, clipped_max), clipped_max)
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).to(log_prob.dtype), response_mask)
            lower = ((clipped_max > dual_bound) & negative).to(log_prob.dtype)
            clipfrac_lower = masked_mean(lower, response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, clipfrac_lower, ppo_kl)


class GSPO(_ClippedLoss):
    """Group sequence policy optimisation: PPO clipping of the sequence-level ratio
    (geometric mean of token ratios), with each token's gradient through its own log-prob."""

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "gspo"

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
        mask = response_mask.to(log_prob.dtype)
        log_ratio = log_prob - old_log_prob
        lengths = mask.sum(dim=-1).clamp(min=1)
        sequence_log_ratio = (log_ratio * mask).sum(dim=-1) / lengths
        # value: the sequence ratio; gradient: d log_prob of each token
        token_log_ratio = log_prob - log_prob.detach() + sequence_log_ratio.detach().unsqueeze(-1)
        # capped from above only, as verl's gspo caps the sequence log ratio
        ratio = torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX).exp()
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high)
        losses = torch.maximum(unclipped, clipped)
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).to(log_prob.dtype), response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, 0.0, ppo_kl)


class ClipCov(_ClippedLoss):
    """Clip-Cov: PPO clipping, plus the gradient of a few tokens with a large covariance of
    advantage and log-prob set to zero (against entropy collapse).

    The covariance and the number of tokens cut are computed over the micro-batch, as in the
    method's reference implementation, so this loss depends on the micro-batch split. Tokens are
    chosen at random among the candidates (torch's global generator).
    """

    name = "clip_cov"

    @property
    def options(self) -> ClipCovArgs:
        return self.args if isinstance(self.args, ClipCovArgs) else ClipCovArgs()

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
        valid = response_mask != 0
        log_ratio = log_prob - old_log_prob  # unbounded, as in verl's clip_cov
        ratio = log_ratio.exp()
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high)
        with torch.no_grad():
            detached = log_prob.detach()
            covariance = (advantages - masked_mean(advantages, response_mask)) * (
                detached - masked_mean(detached, response_mask)
            )
            already_clipped = (clipped > unclipped) & valid
            candidates = (
                valid
                & ~already_clipped
                & (covariance > options.clip_cov_lb)
                & (covariance < options.clip_cov_ub)
            )
            positions = torch.nonzero(candidates)
            budget = max(int(options.clip_cov_ratio * int(valid.sum())), 1)
            if len(positions) > budget:
                chosen = torch.randperm(len(positions), device=positions.device)[:budget]
                positions = positions[chosen]
            keep = torch.ones_like(log_prob)
            keep[positions[:, 0], positions[:, 1]] = 0
        losses = torch.maximum(unclipped, clipped) * keep
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean((keep == 0).to(log_prob.dtype), response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, 0.0, ppo_kl)


class KLCov(PolicyLoss):
    """KL-Cov: the unclipped policy gradient, plus ``ppo_kl_coef * |log ratio|`` on the tokens
    with the largest covariance of advantage and log-prob (against entropy collapse).

    The covariance ranking is over the micro-batch, as in the method's reference
    implementation, so this loss depends on the micro-batch split. ``actor/pg_clipfrac`` is the
    share of tokens penalised.
    """

    name = "kl_cov"

    @property
    def options(self) -> KLCovArgs:
        return self.args if isinstance(self.args, KLCovArgs) else KLCovArgs()

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
        log_ratio = log_prob - old_log_prob  # unbounded, as in verl's kl_cov
        ratio = log_ratio.exp()
        losses = -advantages * ratio
        penalised = torch.zeros_like(log_prob, dtype=torch.bool)
        with torch.no_grad():
            valid = response_mask != 0
            count = int(valid.sum())
            if count:
                adv = advantages[valid]
                logp = log_prob.detach()[valid]
                covariance = (adv - adv.mean()) * (logp - logp.mean())
                top = torch.topk(covariance, max(1, int(count * options.kl_cov_ratio))).indices
                flat = torch.zeros(count, dtype=torch.bool, device=log_prob.device)
                flat[top] = True
                penalised[valid] = flat
        losses = torch.where(penalised, losses + options.ppo_kl_coef * log_ratio.abs(), losses)
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean(penalised.to(log_prob.dtype), response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, 0.0, ppo_kl)


class GeoMean(_ClippedLoss):
    """GMPO: the geometric mean of token ratios, clipped per token in log space
    (``log ratio`` within ``[-clip_ratio_low, clip_ratio_high]``, pessimistic side by the sign
    of the advantage), times the response's mean advantage.

    The loss is per response, so it is always averaged over responses (each response's share is
    ``1 / num_seqs``), whatever ``actor.loss_agg_mode`` says.
    """

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "geo_mean"

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
        mask = response_mask.to(log_prob.dtype)
        log_ratio = log_prob - old_log_prob  # bounded by the clip below, as in verl's geo_mean
        clamped = torch.clamp(log_ratio, -self.clip_low, self.clip_high)
        sign = torch.sign(advantages)
        pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
        lengths = mask.sum(dim=-1).clamp(min=1)
        sequence_ratio = torch.exp((pessimistic * mask).sum(dim=-1) / lengths)
        sequence_advantage = (advantages * mask).sum(dim=-1) / lengths
        sequence_losses = -sequence_advantage * sequence_ratio
        if importance_weights is not None:
            log_weights = torch.log(importance_weights.detach().to(mask.dtype) + 1e-10)
            sequence_losses = sequence_losses * torch.exp((log_weights * mask).sum(-1) / lengths)
        per_response = getattr(aggregate, "with_mode", None)
        reduce = per_response("seq-mean-token-mean") if per_response else aggregate
        # every token carries its response's loss; the per-response token mean is that loss
        loss = reduce(sequence_losses.unsqueeze(-1).expand_as(mask), response_mask)
        with torch.no_grad():
            was_clipped = (log_ratio != clamped).to(log_prob.dtype)
            clipfrac = masked_mean(was_clipped * (advantages > 0), response_mask)
            clipfrac_lower = masked_mean(was_clipped * (advantages < 0), response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, clipfrac_lower, ppo_kl)


class CISPO(_ClippedLoss):
    """CISPO: REINFORCE weighted by the clipped importance ratio, with no gradient through the
    ratio, so clipped tokens still contribute a gradient."""

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "cispo"

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
        # clamped as verl's cispo loss clamps it (the ratio only weighs, without gradient)
        log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        clipped_ratio = torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high).detach()
        losses = -clipped_ratio * advantages * log_prob
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean((ratio != clipped_ratio).to(log_prob.dtype), response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, 0.0, ppo_kl)


class Reinforce(PolicyLoss):
    """Plain policy gradient ``-A * log_prob`` (no ratio, no clipping)."""

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "reinforce"

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
        losses = -advantages * log_prob
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            ppo_kl = masked_mean(old_log_prob - log_prob, response_mask)
        return loss, _metrics(loss, 0.0, 0.0, ppo_kl)


class SAPO(PolicyLoss):
    """SAPO: a soft gate in place of PPO's clip. Each token's ratio passes through
    ``(4 / tau) * sigmoid(tau * (ratio - 1))``, whose slope at ratio 1 is 1 (the plain policy
    gradient on-policy) and fades smoothly as the ratio moves away, so no token's gradient is
    cut off at a hard edge. ``tau_pos`` serves tokens with a positive advantage, ``tau_neg``
    the others. As the method prescribes, the loss is averaged per sequence
    (``seq-mean-token-mean``) whatever ``loss_agg_mode`` says."""

    zero_at_zero_advantage: ClassVar[bool] = True

    name = "sapo"

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
        args = self.args if isinstance(self.args, SapoArgs) else SapoArgs()
        log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        tau = torch.where(
            advantages > 0,
            torch.as_tensor(args.tau_pos, dtype=ratio.dtype, device=ratio.device),
            torch.as_tensor(args.tau_neg, dtype=ratio.dtype, device=ratio.device),
        )
        gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        losses = -gates * advantages
        per_sequence = getattr(aggregate, "with_mode", None)
        if per_sequence is not None:
            aggregate = per_sequence("seq-mean-token-mean")
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, 0.0, 0.0, ppo_kl)


class _DPPO(_ClippedLoss):
    """DPPO (divergence PPO, binary form): REINFORCE ``-A * w * log_prob`` with the ratio
    ``w = min(ratio, clip_ratio_c)`` as a weight without gradient, on the tokens inside a trust
    region; a token outside it adds nothing. The region bounds a divergence between the old and
    the new probability of the sampled token, not the ratio, so ``clip_ratio_low`` and
    ``clip_ratio_high`` are divergence thresholds here: for ``A > 0`` a token leaves the region
    when its probability rose past ``clip_ratio_high``, for ``A <= 0`` when it fell past
    ``clip_ratio_low``. ``clip_ratio_c`` truncates the weight (verl's default 3, the method
    suggests a large one such as 20) instead of PPO's dual clip.

    ``actor/pg_clipfrac`` is the share of tokens outside the region, ``actor/pg_clipfrac_lower``
    the share inside it whose ratio was truncated."""

    zero_at_zero_advantage: ClassVar[bool] = True

    @abstractmethod
    def inside(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        """Tokens inside the trust region (bool), from the detached log-probs."""

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
        # clamped as verl's dppo losses clamp it
        log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        with torch.no_grad():
            truncated = torch.clamp(ratio, max=self.config.clip_ratio_c)
            kept = self.inside(log_prob.detach(), old_log_prob, advantages).to(log_prob.dtype)
        losses = -advantages * truncated * log_prob * kept
        loss = aggregate(_weighted(losses, importance_weights), response_mask)
        with torch.no_grad():
            clipfrac = masked_mean(1.0 - kept, response_mask)
            capped = (ratio > self.config.clip_ratio_c).to(log_prob.dtype) * kept
            clipfrac_lower = masked_mean(capped, response_mask)
            ppo_kl = masked_mean(-log_ratio, response_mask)
        return loss, _metrics(loss, clipfrac, clipfrac_lower, ppo_kl)


class DPPOTV(_DPPO):
    """DPPO-Binary-TV: the region bounds the change of the token's probability,
    ``pi - pi_old`` at most ``clip_ratio_high`` (A > 0) and at least ``-clip_ratio_low``
    (A <= 0)."""

    name = "dppo_tv"

    def inside(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        change = log_prob.exp() - old_log_prob.exp()
        return torch.where(advantages > 0, change <= self.clip_high, change >= -self.clip_low)


DPPO_KL_EPSILON = 1e-8
"""Added inside the logarithm of the complement probabilities of DPPO-Binary-KL, as verl adds
it, so that a token of probability 1 gives a finite divergence."""


class DPPOKL(_DPPO):
    """DPPO-Binary-KL: the region bounds the KL from the old to the new two-outcome
    distribution (this token, or any other): a token whose probability moved in the
    advantage's direction leaves it once that KL exceeds ``clip_ratio_high`` (A > 0) or
    ``clip_ratio_low`` (A <= 0); a move against the advantage's direction never does."""

    name = "dppo_kl"

    def inside(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        prob, old_prob = log_prob.exp(), old_log_prob.exp()
        divergence = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1 - old_prob + DPPO_KL_EPSILON) / (1 - prob + DPPO_KL_EPSILON)
        )
        rising = (divergence <= self.clip_high) | (prob <= old_prob)
        falling = (divergence <= self.clip_low) | (prob >= old_prob)
        return torch.where(advantages > 0, rising, falling)
