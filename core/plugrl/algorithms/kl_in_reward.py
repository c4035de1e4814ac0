"""KL in the reward (``algorithm.use_kl_in_reward``): token rewards minus a KL penalty against
the reference model, with a fixed or adaptive coefficient kept across steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from plugrl.algorithms.functional import masked_mean
from plugrl.data.batch import Batch
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import KLControlConfig
from plugrl.plugin.manager import PluginManager

if TYPE_CHECKING:
    from plugrl.recipe import Recipe


@attrs.define
class FixedKLController:
    """A constant coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@attrs.define
class AdaptiveKLController:
    """Proportional control of the coefficient towards ``target_kl`` (Ziegler et al. 2019):
    ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""

    value: float
    target_kl: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target_kl - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(config: KLControlConfig) -> KLController:
    """The controller ``algorithm.kl_ctrl`` describes."""
    if config.type == "fixed":
        return FixedKLController(config.kl_coef)
    if config.type == "adaptive":
        if config.target_kl <= 0:
            raise RecipeError(
                "the adaptive KL controller needs a target_kl > 0 "
                f"(got {config.target_kl}); set it or use kl_ctrl.type=fixed",
                key="algorithm.kl_ctrl.target_kl",
            )
        return AdaptiveKLController(config.kl_coef, config.target_kl, config.horizon)
    raise RecipeError(
        f"unknown KL controller {config.type!r}; choose fixed or adaptive",
        key="algorithm.kl_ctrl.type",
    )


def apply_kl_in_reward(
    batch: Batch,
    controller: KLController,
    penalty: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> dict[str, float]:
    """Set ``token_level_rewards = token_level_scores - beta * kl`` and update the controller.

    ``kl`` is ``penalty(old_log_probs, ref_log_prob)`` on response tokens (0 elsewhere);
    ``beta`` is the controller's value before the update. The controller is updated with the
    batch KL (mean over responses of each response's token-mean KL) and ``n_steps`` = rows.
    Returns ``actor/reward_kl_penalty`` (that KL) and ``actor/reward_kl_penalty_coeff``
    (``beta``).
    """
    batch.require(
        "token_level_scores",
        "old_log_probs",
        "ref_log_prob",
        "response_mask",
        by="KL in reward (algorithm.use_kl_in_reward)",
    )
    mask = batch["response_mask"].to(batch["token_level_scores"].dtype)
    kl = penalty(batch["old_log_probs"], batch["ref_log_prob"]).to(mask.dtype) * mask
    beta = controller.value
    batch["token_level_rewards"] = batch["token_level_scores"] - beta * kl
    rows = len(batch)
    # an empty response counts as KL 0, so the mean is over every response
    current_kl = float(masked_mean(kl, mask, dim=-1).mean()) if rows else 0.0
    controller.update(current_kl=current_kl, n_steps=rows)
    return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


class KLInReward:
    """``algorithm.use_kl_in_reward``: the chosen estimator and controller, kept across steps.

    ``kl_in_reward(batch)`` sets ``token_level_rewards`` and returns the metrics; its
    ``state_dict`` (the adaptive coefficient) belongs in a checkpoint.
    """

    def __init__(
        self,
        penalty: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        controller: KLController,
    ) -> None:
        self.penalty = penalty
        self.controller = controller

    @classmethod
    def from_recipe(cls, recipe: Recipe, plugins: PluginManager) -> KLInReward:
        algorithm = recipe.algorithm
        penalty = plugins.registry("kl_penalties").load(algorithm.kl_penalty)
        return cls(penalty, make_kl_controller(algorithm.kl_ctrl))

    def __call__(self, batch: Batch) -> dict[str, float]:
        return apply_kl_in_reward(batch, self.controller, self.penalty)

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)
