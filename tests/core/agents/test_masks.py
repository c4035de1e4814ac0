"""Observation tokens take no part in training: a real backward through the tiny model and
the actor objective gives their positions zero gradient in every loss aggregation, and the
estimators give the sampled tokens of a trajectory with holes what they give the same tokens
without the holes."""

from __future__ import annotations

import pytest
import torch

from plugrl.agents.batch import build_trajectory_batch
from plugrl.algorithms.functional import LOSS_AGG_MODES
from plugrl.algorithms.objective import PolicyObjective
from plugrl.algorithms.training import all_reduced_loss_scale, response_log_probs
from plugrl.data.batch import Batch, left_pad
from plugrl.parts.agent import Trajectory
from plugrl.plugin.build import build_estimator

OBSERVED = [0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0]
"""1 where a token was appended between turns (a tool result), for a 12-token response."""


def trajectories(seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for row in range(4):
        length = 12 - row  # ragged, so padding is in play too
        ids = torch.randint(3, 300, (length,), generator=generator).tolist()
        mask = [1 - o for o in OBSERVED[:length]]
        out.append(
            Trajectory(
                prompt_ids=torch.randint(3, 300, (3 + row,), generator=generator).tolist(),
                response_ids=ids,
                loss_mask=mask,
                log_probs=[-1.0 * m for m in mask],
                token_versions=[0] * length,
                turn_ends=[length - 1],
                num_turns=2,
            )
        )
    return out


def trajectory_batch():
    samples = trajectories()
    prompts_ids, prompt_mask = left_pad([[1]] * 2, 0)
    prompts = Batch(
        tensors={"prompts": prompts_ids, "prompt_attention_mask": prompt_mask},
        columns={"uid": ["a", "b"]},
    )
    return build_trajectory_batch(
        prompts, [[[samples[0]], [samples[1]]], [[samples[2]], [samples[3]]]], pad_token_id=0
    )


@pytest.fixture(scope="module")
def tiny_model():
    from plugrl.testing import make_tiny_model

    torch.manual_seed(0)
    return make_tiny_model(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1
    ).float()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_observation_tokens_get_zero_gradient_in_every_loss_aggregation(
    tiny_model, plugrl_recipe, plugrl_plugin_manager, mode
):
    recipe = plugrl_recipe(
        {
            "actor.loss_agg_mode": mode,
            "actor.entropy_coeff": 0.01,
            "actor.use_kl_loss": True,
            "data.max_response_length": 12,
        }
    )
    objective = PolicyObjective.from_recipe(recipe, plugrl_plugin_manager)
    batch = trajectory_batch()
    mask = batch["response_mask"]
    width = batch["responses"].shape[-1]
    batch["old_log_probs"] = batch["rollout_log_probs"]
    batch["ref_log_prob"] = batch["rollout_log_probs"] - 0.1 * mask
    batch["advantages"] = torch.linspace(-1, 1, mask.numel()).reshape(mask.shape) * mask
    scale = all_reduced_loss_scale(mask, recipe.actor, recipe, 1, torch.device("cpu"))

    def loss_of(perturb_observed: bool):
        output = tiny_model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        )
        # the positions that predict the response tokens
        logits = output.logits[:, -width - 1 : -1].float()
        logits.retain_grad()
        used = logits
        if perturb_observed:
            observed = (1 - mask).bool() & batch["attention_mask"][:, -width:].bool()
            used = logits + 5.0 * observed.unsqueeze(-1) * torch.randn_like(logits)
        log_prob, entropy = response_log_probs(used, batch, 1.0, with_entropy=True)
        loss, _ = objective(batch, log_prob, entropy, scale)
        return loss, logits

    loss, logits = loss_of(False)
    loss.backward()
    observed = (mask == 0).unsqueeze(-1).expand_as(logits.grad)
    assert logits.grad[observed].abs().max() == 0
    assert logits.grad[~observed].abs().max() > 0
    tiny_model.zero_grad()
    perturbed, _ = loss_of(True)
    assert perturbed.item() == pytest.approx(loss.item(), abs=1e-6)


def compact(batch: Batch) -> Batch:
    """``batch`` with every masked position inside a response removed (the sampled tokens
    side by side), right-padded again."""
    mask = batch["response_mask"].bool()
    width = int(mask.sum(-1).max())
    out = {}
    for name in ("token_level_rewards", "values"):
        rows = [batch[name][r][mask[r]] for r in range(len(batch))]
        out[name] = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in rows])
    counts = mask.sum(-1).tolist()
    kept = torch.tensor([[1] * c + [0] * (width - c) for c in counts], dtype=torch.long)
    return Batch({**out, "response_mask": kept}, {"uid": list(batch["uid"])})


@pytest.mark.parametrize("estimator", ["grpo", "gae", "reinforce_plus_plus"])
def test_estimators_give_sampled_tokens_what_they_would_get_without_the_observations(
    plugrl_recipe, plugrl_plugin_manager, estimator
):
    recipe = plugrl_recipe(
        {"algorithm.adv_estimator": estimator, "algorithm.gamma": 0.9, "algorithm.lam": 0.8}
    )
    batch = trajectory_batch()
    mask = batch["response_mask"]
    generator = torch.Generator().manual_seed(1)
    rewards = torch.zeros(mask.shape)
    last = torch.stack([row.nonzero().max() for row in mask])
    rewards[torch.arange(len(batch)), last] = torch.tensor([1.0, 0.0, 0.5, 2.0])
    # values at observation positions are noise the critic predicted there: they must not count
    values = torch.randn(mask.shape, generator=generator)
    with_holes = Batch(
        {"token_level_rewards": rewards, "values": values, "response_mask": mask},
        {"uid": list(batch["uid"])},
    )
    compute = build_estimator(recipe, plugrl_plugin_manager).compute
    advantages, _ = compute(with_holes)
    assert (advantages[mask == 0] == 0).all()
    expected, _ = compute(compact(with_holes))
    for row in range(len(batch)):
        torch.testing.assert_close(
            advantages[row][mask[row].bool()], expected[row][: int(mask[row].sum())]
        )
