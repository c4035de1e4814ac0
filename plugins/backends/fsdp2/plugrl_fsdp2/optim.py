"""AdamW and its learning-rate schedule (:mod:`plugrl.algorithms.training`'s, stepped by
torch's LambdaLR)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from plugrl.api.backend import OptimConfig, adamw, lr_schedule


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` with the schedule stepped once per update."""
    optimizer = adamw(params, config)
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
