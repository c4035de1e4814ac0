"""Group-median baseline advantages."""

from __future__ import annotations

from collections import defaultdict

import torch

from plugrl.api.algorithms import AdvantageEstimator
from plugrl.api.data import Batch

from .options import MedianBaselineConfig


class MedianBaseline(AdvantageEstimator):
    """A_i = (s_i - median(group)) [/ (MAD(group) + eps)], broadcast over response tokens."""

    requires = ("token_level_rewards", "response_mask", "uid")

    def compute(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        mask = batch["response_mask"].to(torch.float32)
        scores = (batch["token_level_rewards"] * mask).sum(dim=-1)
        groups: dict[object, list[int]] = defaultdict(list)
        for row, uid in enumerate(batch["uid"]):
            groups[uid].append(row)
        options = self.args if isinstance(self.args, MedianBaselineConfig) else None
        options = options or MedianBaselineConfig()  # built without options: the defaults
        scale_by_mad, eps = options.scale_by_mad, options.eps
        advantages = torch.zeros_like(scores)
        for rows in groups.values():
            index = torch.tensor(rows)
            group = scores[index]
            # torch.median returns the lower middle value; the mean of both middles is the
            # textbook median for even group sizes
            median = group.quantile(0.5)
            centred = group - median
            if scale_by_mad:
                centred = centred / ((group - median).abs().quantile(0.5) + eps)
            advantages[index] = centred
        token_advantages = advantages.unsqueeze(-1) * mask
        return token_advantages, token_advantages
