"""Advantage estimators: token-level rewards (and values or baselines) -> advantages, returns.

Every estimator returns ``(advantages, returns)`` of shape [B, R], zero off ``response_mask``.
Outcome estimators take a response's score as the sum of its token-level rewards and group
responses by the prompt's ``uid`` (non-tensor column). Formulas: docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from plugrl.api import DataError, RecipeError
from plugrl.api.algorithms import AdvantageEstimator, compute_rollout_is_weights, masked_whiten
from plugrl.api.data import Batch

from .options import GAEArgs, GDPOArgs, OptimalTokenBaselineArgs

GROUP_EPSILON = 1e-6
"""Added to a group's std before dividing by it (an all-equal group has std 0)."""

OUTCOME_COLUMNS = ("token_level_rewards", "response_mask", "uid")


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


class Groups:
    """Responses grouped by prompt uid: per-row group index and per-group statistics."""

    def __init__(self, uids: Sequence[Any], device: torch.device | None = None) -> None:
        index: dict[Any, int] = {}
        rows = []
        for row, uid in enumerate(uids):
            try:
                rows.append(index.setdefault(uid, len(index)))
            except TypeError:
                raise DataError(
                    f"uid of row {row} is {uid!r}, which cannot identify a group; "
                    "uids must be strings or numbers"
                ) from None
        self.index = torch.tensor(rows, dtype=torch.long, device=device)
        self.num_groups = len(index)
        self.sizes = torch.bincount(self.index, minlength=self.num_groups)

    def size_of_row(self) -> torch.Tensor:
        return self.sizes[self.index]

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-group sum of a per-row tensor [B] -> [G]."""
        out = torch.zeros(self.num_groups, dtype=values.dtype, device=values.device)
        return out.index_add_(0, self.index, values)

    def mean_and_std(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row group mean and unbiased std; a group of one has mean 0 and std 1."""
        sizes = self.sizes.to(scores.dtype)
        mean = self.sum(scores) / sizes
        squared = self.sum((scores - mean[self.index]).square())
        std = (squared / (sizes - 1).clamp(min=1)).sqrt()
        single = self.sizes == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        return mean[self.index], std[self.index]


def outcome_scores(batch: Batch) -> torch.Tensor:
    """Each response's score: the sum of its token-level rewards [B]."""
    return batch["token_level_rewards"].sum(dim=-1)


def _groups(batch: Batch) -> Groups:
    return Groups(batch["uid"], device=batch["token_level_rewards"].device)


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * mask.to(per_row.dtype)


# --------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------


class _Estimator(AdvantageEstimator):
    name: ClassVar[str] = ""

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.compute(batch)

    def _require(self, batch: Batch) -> None:
        batch.require(*self.requires, by=f"advantage estimator {self.name!r}")


class GAE(_Estimator):
    """Generalised advantage estimation with a learned value function (PPO)."""

    name = "gae"
    requires = ("token_level_rewards", "values", "response_mask")

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        rewards = batch["token_level_rewards"]
        values = batch["values"].to(rewards.dtype)
        mask = batch["response_mask"].to(rewards.dtype)
        gamma, lam = self.config.gamma, self.config.lam
        whiten = self.args.whiten if isinstance(self.args, GAEArgs) else True
        with torch.no_grad():
            next_value = torch.zeros_like(rewards[:, 0])
            running = torch.zeros_like(rewards[:, 0])
            advantages = torch.zeros_like(rewards)
            for t in reversed(range(rewards.shape[1])):
                delta = rewards[:, t] + gamma * next_value - values[:, t]
                candidate = delta + gamma * lam * running
                # tokens off the mask (padding, tool observations) pass the recursion through
                valid = mask[:, t]
                next_value = valid * values[:, t] + (1 - valid) * next_value
                running = valid * candidate + (1 - valid) * running
                advantages[:, t] = running
            returns = (advantages + values) * mask
            if whiten:
                advantages = masked_whiten(advantages, mask)
            advantages = advantages * mask
        return advantages, returns


class GRPO(_Estimator):
    """Group-relative advantages: (score - group mean) / (group std + eps); Dr.GRPO without
    the std (``algorithm.norm_adv_by_std_in_grpo: false``)."""

    name = "grpo"
    requires = OUTCOME_COLUMNS

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            mean, std = _groups(batch).mean_and_std(scores)
            advantage = scores - mean
            if self.config.norm_adv_by_std_in_grpo:
                advantage = advantage / (std + GROUP_EPSILON)
            advantages = _broadcast(advantage, batch["response_mask"])
        return advantages, advantages


class RLOO(_Estimator):
    """REINFORCE leave-one-out: score minus the mean of the group's other scores."""

    name = "rloo"
    requires = OUTCOME_COLUMNS

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            groups = _groups(batch)
            sizes = groups.size_of_row().to(scores.dtype)
            others_mean = (groups.sum(scores)[groups.index] - scores) / (sizes - 1).clamp(min=1)
            # a group of one has no other response to compare with: its score stays
            advantage = torch.where(sizes > 1, scores - others_mean, scores)
            advantages = _broadcast(advantage, batch["response_mask"])
        return advantages, advantages


class OPO(_Estimator):
    """On-policy optimal baseline: score minus the length-weighted mean score of the group."""

    name = "opo"
    requires = OUTCOME_COLUMNS

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            mask = batch["response_mask"]
            lengths = mask.to(scores.dtype).sum(dim=-1)
            groups = _groups(batch)
            weighted = groups.sum(lengths * scores) / groups.sum(lengths).clamp(min=1)
            baseline = torch.where(groups.sizes > 1, weighted, torch.zeros_like(weighted))[
                groups.index
            ]
            advantages = _broadcast(scores - baseline, mask)
        return advantages, advantages


class GPG(_Estimator):
    """Group policy gradient: ``alpha * (score - group mean)`` with ``alpha = B / (number of
    non-zero scores in the batch)``."""

    name = "gpg"
    requires = OUTCOME_COLUMNS

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            mean, _ = _groups(batch).mean_and_std(scores)
            nonzero = torch.count_nonzero(scores).clamp(min=1)
            alpha = scores.shape[0] / nonzero.to(scores.dtype)
            advantages = _broadcast(alpha * (scores - mean), batch["response_mask"])
        return advantages, advantages


class GRPOPassK(_Estimator):
    """Pass@k training: only each group's best response gets an advantage, the margin over
    the second best (divided by the group std unless Dr.GRPO)."""

    name = "grpo_passk"
    requires = OUTCOME_COLUMNS
    min_group_size: ClassVar[int] = 2

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            groups = _groups(batch)
            if bool((groups.sizes < 2).any()):
                small = int(groups.sizes.min())
                raise DataError(
                    f"grpo_passk needs at least 2 responses per prompt, a group has {small}; "
                    "set rollout.n >= 2"
                )
            _, std = groups.mean_and_std(scores)
            advantage = torch.zeros_like(scores)
            for group in range(groups.num_groups):
                rows = torch.nonzero(groups.index == group).squeeze(-1)
                top = torch.topk(scores[rows], 2)
                margin = top.values[0] - top.values[1]
                best = rows[top.indices[0]]
                if self.config.norm_adv_by_std_in_grpo:
                    margin = margin / (std[best] + GROUP_EPSILON)
                advantage[best] = margin
            advantages = _broadcast(advantage, batch["response_mask"])
        return advantages, advantages


class ReinforcePlusPlus(_Estimator):
    """REINFORCE++: discounted return-to-go of the token rewards, whitened over the batch."""

    name = "reinforce_plus_plus"
    requires = ("token_level_rewards", "response_mask")

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        rewards = batch["token_level_rewards"]
        mask = batch["response_mask"].to(rewards.dtype)
        gamma = self.config.gamma
        with torch.no_grad():
            returns = torch.zeros_like(rewards)
            running = torch.zeros_like(rewards[:, 0])
            for t in reversed(range(rewards.shape[1])):
                candidate = rewards[:, t] + gamma * running
                valid = mask[:, t]
                returns[:, t] = candidate * valid
                # off-mask tokens carry the return through unchanged
                running = valid * candidate + (1 - valid) * running
            advantages = masked_whiten(returns, mask) * mask
        return advantages, returns


class ReinforcePlusPlusBaseline(_Estimator):
    """REINFORCE++ with a group-mean baseline, whitened over the batch."""

    name = "reinforce_plus_plus_baseline"
    requires = OUTCOME_COLUMNS

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        with torch.no_grad():
            scores = outcome_scores(batch)
            mean, _ = _groups(batch).mean_and_std(scores)
            mask = batch["response_mask"].to(scores.dtype)
            centred = _broadcast(scores - mean, mask)
            advantages = masked_whiten(centred, mask) * mask
        return advantages, advantages


class ReMax(_Estimator):
    """ReMax: return-to-go minus the reward of the greedy response to the same prompt."""

    name = "remax"
    requires = ("token_level_rewards", "reward_baselines", "response_mask")

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        rewards = batch["token_level_rewards"]
        mask = batch["response_mask"].to(rewards.dtype)
        baselines = batch["reward_baselines"].to(rewards.dtype).reshape(-1)
        with torch.no_grad():
            returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
            advantages = returns - baselines.unsqueeze(-1) * mask
        return advantages, returns


class GDPO(_Estimator):
    """GDPO: each reward component normalised within its group as GRPO normalises the score
    (``norm_adv_by_std_in_grpo`` applies), the normalised components summed with their
    weights, then whitened over the batch's valid tokens.

    The components are per-response batch columns the reward manager returns
    (``algorithm.adv_estimator_args.gdpo_reward_keys``)."""

    name = "gdpo"
    requires = OUTCOME_COLUMNS

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        args = self.args if isinstance(self.args, GDPOArgs) else GDPOArgs()
        key = "algorithm.adv_estimator_args"
        if not args.gdpo_reward_keys:
            raise RecipeError(
                "gdpo normalises each reward component on its own and needs their names; "
                "set it to the fields your reward function returns, e.g. "
                "[accuracy_reward, format_reward]",
                key=f"{key}.gdpo_reward_keys",
            )
        weights = args.gdpo_reward_weights
        if weights is not None and len(weights) != len(args.gdpo_reward_keys):
            raise RecipeError(
                f"gives {len(weights)} weights for {len(args.gdpo_reward_keys)} reward keys; "
                "give one per key or leave it unset",
                key=f"{key}.gdpo_reward_weights",
            )
        self.reward_keys = list(args.gdpo_reward_keys)
        self.reward_weights = (
            list(weights) if weights is not None else [1.0] * len(self.reward_keys)
        )

    def _component(self, batch: Batch, key: str, like: torch.Tensor) -> torch.Tensor:
        if key not in batch:
            raise DataError(
                f"gdpo reward key {key!r} is not a batch column; the reward function must "
                f"return it in its result (algorithm.adv_estimator_args.gdpo_reward_keys)"
            )
        # a sample whose reward function failed holds None in its fields (reward.on_error):
        # it scores 0 in every component, as it scores 0 (or the fallback) overall
        values = [0.0 if v is None else v for v in batch[key]]
        try:
            return torch.as_tensor(
                [float(v) for v in values], dtype=like.dtype, device=like.device
            ).reshape(-1)
        except (TypeError, ValueError):
            raise DataError(
                f"gdpo reward key {key!r} must hold one number per response, got "
                f"{list(values)[:3]!r}..."
            ) from None

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self._require(batch)
        rewards = batch["token_level_rewards"]
        mask = batch["response_mask"].to(rewards.dtype)
        groups = _groups(batch)
        with torch.no_grad():
            total = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
            for key, weight in zip(self.reward_keys, self.reward_weights, strict=True):
                scores = self._component(batch, key, rewards)
                mean, std = groups.mean_and_std(scores)
                normalised = scores - mean
                if self.config.norm_adv_by_std_in_grpo:
                    normalised = normalised / (std + GROUP_EPSILON)
                total = total + weight * normalised
            advantages = masked_whiten(_broadcast(total, mask), mask) * mask
        return advantages, advantages


OTB_EPSILON = 1e-8
"""Added to the denominator of the optimal token baseline (a group whose weights are all 0)."""


class OptimalTokenBaseline(_Estimator):
    """Optimal token baseline: a baseline per token position, the group's returns-to-go
    weighted by each response's accumulated gradient-variance proxy up to that token.

    ``w_t = 1 - 2 pi_t + sum_v pi_v^2`` estimates the squared norm of the score function of
    token ``t`` (``pi_t``: the sampled token's probability under the policy that computed
    ``old_log_probs``; ``sum_pi_squared`` from the same log-prob pass); ``W_t`` is its sum up
    to ``t`` along the response (times the square of the rollout importance weight, when
    rollout correction is on). The baseline of position ``t`` is
    ``sum_j G_t^j W_t^j / sum_j W_t^j`` over the responses ``j`` of the group, and
    ``A_t = G_t - b_t`` with ``G_t`` the return-to-go. A group of one has baseline 0.

    This estimator aligns responses by column position; ``tir_optimal_token_baseline``
    aligns them by the index of the valid token (responses with tool output inside)."""

    name = "optimal_token_baseline"
    requires = (*OUTCOME_COLUMNS, "old_log_probs", "sum_pi_squared")
    by_valid_token: ClassVar[bool] = False

    def _importance_weights(self, batch: Batch) -> torch.Tensor | None:
        if "rollout_is_weights" in batch:
            return batch["rollout_is_weights"]
        algorithm = self.config
        if algorithm.rollout_is is None or "rollout_log_probs" not in batch:
            return None
        weights, _ = compute_rollout_is_weights(
            batch["old_log_probs"],
            batch["rollout_log_probs"],
            batch["response_mask"],
            algorithm.rollout_is,
            algorithm.rollout_is_threshold,
            kpop_threshold=algorithm.kpop_threshold,
        )
        return weights

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        batch.require(
            *self.requires,
            by=f"advantage estimator {self.name!r} (sum_pi_squared comes from the actor's "
            "old_log_prob pass, which the run asks for when this estimator is chosen)",
        )
        args = self.args if isinstance(self.args, OptimalTokenBaselineArgs) else None
        zero_tail = args.handle_zero_tail if args is not None else True
        rewards = batch["token_level_rewards"]
        mask = batch["response_mask"].to(rewards.dtype)
        with torch.no_grad():
            returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
            token_prob = batch["old_log_probs"].to(rewards.dtype).exp()
            variance = 1 - 2 * token_prob + batch["sum_pi_squared"].to(rewards.dtype)
            weights = self._importance_weights(batch)
            if weights is not None:
                variance = variance * weights.to(rewards.dtype).square()
            accumulated = (variance * mask).cumsum(-1)
            if self.by_valid_token:
                advantages = self._by_valid_token(batch, returns, accumulated, mask, zero_tail)
            else:
                advantages = self._by_position(batch, returns, accumulated, mask, zero_tail)
        return advantages * mask, returns

    def _by_position(
        self,
        batch: Batch,
        returns: torch.Tensor,
        accumulated: torch.Tensor,
        mask: torch.Tensor,
        zero_tail: bool,
    ) -> torch.Tensor:
        groups = _groups(batch)
        lengths = mask.sum(-1)
        baselines = torch.zeros_like(returns)
        for group in range(groups.num_groups):
            rows = torch.nonzero(groups.index == group).squeeze(-1)
            if len(rows) < 2:
                continue
            weight = accumulated[rows] * mask[rows]
            baseline = (returns[rows] * weight).sum(0) / (weight.sum(0) + OTB_EPSILON)
            baselines[rows] = baseline
            if zero_tail:
                _zero_longest_tail(baselines, rows, lengths[rows])
        return returns - baselines

    def _by_valid_token(
        self,
        batch: Batch,
        returns: torch.Tensor,
        accumulated: torch.Tensor,
        mask: torch.Tensor,
        zero_tail: bool,
    ) -> torch.Tensor:
        valid = mask != 0
        lengths = valid.sum(-1)
        width = int(lengths.max()) if lengths.numel() else 0
        # each response's valid tokens moved to the front, in order: token k of every
        # response of a group shares a baseline, wherever tool output put it
        order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices[:, :width]
        packed_mask = valid.gather(1, order).to(returns.dtype)
        packed_returns = returns.gather(1, order) * packed_mask
        packed_weight = accumulated.gather(1, order) * packed_mask
        groups = _groups(batch)
        baselines = torch.zeros_like(packed_returns)
        for group in range(groups.num_groups):
            rows = torch.nonzero((groups.index == group) & (lengths > 0)).squeeze(-1)
            if len(rows) < 2:
                continue
            weight = packed_weight[rows]
            baseline = (packed_returns[rows] * weight).sum(0) / (weight.sum(0) + OTB_EPSILON)
            baselines[rows] = baseline
            if zero_tail:
                _zero_longest_tail(baselines, rows, lengths[rows].to(returns.dtype))
        advantages = torch.zeros_like(returns)
        advantages.scatter_(1, order, (packed_returns - baselines) * packed_mask)
        return advantages


class TIROptimalTokenBaseline(OptimalTokenBaseline):
    """The optimal token baseline for responses with tool output inside (multi-turn): token
    ``k`` of each response is the ``k``-th valid token, wherever it sits."""

    name = "tir_optimal_token_baseline"
    by_valid_token = True


def _zero_longest_tail(baselines: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> None:
    """When one response of the group is strictly the longest, its tokens past the second
    longest get baseline 0: the weighted mean there would be its own return."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    holders = torch.nonzero(lengths == longest).squeeze(-1)
    if holders.numel() == 1 and longest > second:
        baselines[rows[holders[0]], second:] = 0.0
