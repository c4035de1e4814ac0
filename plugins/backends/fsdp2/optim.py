"""AdamW and its learning-rate schedule (linear warm-up, then constant or cosine decay)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs
import torch

from plugrl.parts.backend import OptimConfig


# LambdaLR checkpoints a callable object's __dict__, so no slots
@attrs.frozen(slots=False)
class LRSchedule:
    """The learning-rate multiplier of each update step (0-based), as a picklable callable.

    Warm-up rises linearly from 0 over ``warmup_steps``; then the multiplier stays at 1
    (``constant``) or follows half a cosine from 1 down to ``min_lr_ratio`` at
    ``total_steps`` (``cosine``).
    """

    kind: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if self.kind == "constant":
            return 1.0
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def lr_schedule(config: OptimConfig, total_steps: int) -> LRSchedule:
    """The schedule ``config`` describes for a run of ``total_steps`` updates."""
    warmup = config.lr_warmup_steps
    if warmup < 0:
        warmup = int(config.lr_warmup_steps_ratio * total_steps)
    return LRSchedule(config.lr_scheduler_type, warmup, total_steps, config.min_lr_ratio)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` with the schedule stepped once per update."""
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(config, total_steps))
    return optimizer, scheduler


def initialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's per-parameter state without changing any weight.

    A checkpoint can be read only into state that exists, and AdamW creates its state lazily
    at the first step; a step with zero gradients and learning rate 0 creates it (its step
    counter and moments are then overwritten by the checkpoint).
    """
    if optimizer.state:
        return
    saved_lrs = []
    for group in optimizer.param_groups:
        saved_lrs.append(group["lr"])
        group["lr"] = 0.0
        for param in group["params"]:
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(optimizer.param_groups, saved_lrs, strict=True):
        group["lr"] = lr
