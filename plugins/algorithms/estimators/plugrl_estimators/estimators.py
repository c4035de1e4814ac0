"""Advantage estimators: token-level rewards (and values or baselines) -> advantages, returns.

Every estimator returns ``(advantages, returns)`` of shape [B, R], zero off ``response_mask``.
Outcome estimators take a response's score as the sum of its token-level rewards and group
responses by the prompt's ``uid`` (non-tensor column). Formulas: docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from plugrl.api import DataError
from plugrl.api.algorithms import AdvantageEstimator, masked_whiten
from plugrl.api.data import Batch

from .options import GAEArgs

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
