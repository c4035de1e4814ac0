"""The optimizer and learning-rate schedule: megatron's optimizer on accelerators (distributed
optimizer, CPU offload), torch's AdamW on megatron's gradient buffers on the cpu device."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from plugrl.api.backend import LRSchedule, adamw, lr_schedule

if TYPE_CHECKING:
    from megatron.core.transformer import TransformerConfig

    from plugrl_megatron.config import MegatronActorConfig

logger = logging.getLogger("plugrl.megatron")


class StepScheduler:
    """Sets the learning rate of every parameter group once per update; works for torch's
    and megatron's optimizers alike (both expose ``param_groups``)."""

    def __init__(self, optimizer: Any, base_lr: float, schedule: LRSchedule) -> None:
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.schedule = schedule
        self.steps = 0
        self._apply()

    def current_lr(self) -> float:
        return self.base_lr * self.schedule(self.steps)

    def step(self) -> None:
        self.steps += 1
        self._apply()

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])
        self._apply()


def uses_distributed_optimizer(config: MegatronActorConfig, on_cpu: bool) -> bool:
    return config.use_distributed_optimizer and not on_cpu


def is_torch_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, torch.optim.Optimizer)


def build(
    model: list[torch.nn.Module],
    config: MegatronActorConfig,
    transformer_config: TransformerConfig,
    total_steps: int,
    *,
    on_cpu: bool,
) -> tuple[Any, StepScheduler]:
    """The optimizer over ``model``'s chunks and its schedule (stepped once per update)."""
    optim_config = config.optim
    schedule = lr_schedule(optim_config, total_steps)
    if on_cpu:
        if config.use_distributed_optimizer or config.optimizer_cpu_offload:
            logger.info(
                "megatron on cpu: torch AdamW on megatron's gradient buffers (megatron's "
                "distributed optimizer and its offload need CUDA)"
            )
        params = [p for module in model for p in module.parameters() if p.requires_grad]
        optimizer = adamw(params, optim_config)
        return optimizer, StepScheduler(optimizer, optim_config.lr, schedule)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    beta1, beta2 = optim_config.betas
    megatron_config = OptimizerConfig(
        optimizer="adam",
        lr=optim_config.lr,
        min_lr=optim_config.lr * optim_config.min_lr_ratio,
        weight_decay=optim_config.weight_decay,
        adam_beta1=beta1,
        adam_beta2=beta2,
        bf16=transformer_config.bf16,
        fp16=transformer_config.fp16,
        params_dtype=transformer_config.params_dtype,
        use_distributed_optimizer=uses_distributed_optimizer(config, on_cpu),
        optimizer_cpu_offload=config.optimizer_cpu_offload,
        optimizer_offload_fraction=config.optimizer_offload_fraction,
        overlap_cpu_optimizer_d2h_h2d=config.overlap_cpu_optimizer_d2h_h2d,
        clip_grad=config.grad_clip,
    )
    optimizer = get_megatron_optimizer(megatron_config, model)
    return optimizer, StepScheduler(optimizer, optim_config.lr, schedule)
