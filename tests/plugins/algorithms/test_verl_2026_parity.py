"""The algorithms verl added in 2026 give verl 0.9.1's numbers on the same inputs: verl's own
functions were run on the CPU by ``freeze_verl_algorithms.py`` (in this folder), which stored
their inputs and outputs in ``data/verl_2026_algorithms.json``."""

import json
from pathlib import Path

import pytest
import torch

from plugrl.algorithms.functional import LossAggregator, compute_rollout_is_weights
from plugrl.algorithms.training import sum_pi_squared
from plugrl.data.batch import Batch
from plugrl.parts.algorithm import AlgorithmConfig
from plugrl.parts.backend import ActorConfig
from plugrl.testing import part_context
from plugrl_estimators import estimators as E
from plugrl_estimators.options import GDPOArgs, OptimalTokenBaselineArgs
from plugrl_policy_losses import losses as L

FROZEN = json.loads(
    (Path(__file__).parent / "data" / "verl_2026_algorithms.json").read_text("utf-8")
)
INPUTS = FROZEN["inputs"]


def tensor(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual.float(), tensor(expected), atol=atol, rtol=1e-5)


def test_the_frozen_values_are_verls():
    assert FROZEN["verl_version"] == "0.9.1"


OTB_ESTIMATORS = {
    "optimal_token_baseline": E.OptimalTokenBaseline,
    "tir_optimal_token_baseline": E.TIROptimalTokenBaseline,
}


@pytest.mark.parametrize(
    "case",
    FROZEN["optimal_token_baseline"],
    ids=lambda c: f"{c['estimator']}-{c['rewards']}-{c['mask']}-w{int(c['weighted'])}",
)
def test_optimal_token_baseline_equals_verl(case):
    columns = {
        "token_level_rewards": tensor(INPUTS[case["rewards"]]),
        "response_mask": tensor(INPUTS[case["mask"]]).long(),
        "old_log_probs": tensor(INPUTS["old_log_probs"]),
        "sum_pi_squared": tensor(INPUTS["sum_pi_squared"]),
    }
    if case["weighted"]:
        columns["rollout_is_weights"] = tensor(INPUTS["rollout_is_weights"])
    batch = Batch(columns, {"uid": INPUTS["groups"]})
    cls = OTB_ESTIMATORS[case["estimator"]]
    estimator = cls(AlgorithmConfig(), part_context(options=OptimalTokenBaselineArgs()))
    advantages, returns = estimator.compute(batch)
    close(advantages, case["advantages"])
    close(returns, case["returns"])


@pytest.mark.parametrize(
    "case",
    FROZEN["gdpo"]["cases"],
    ids=lambda c: f"weights{c['weights']}-std{int(c['norm_by_std'])}",
)
def test_gdpo_equals_verl(case):
    components = FROZEN["gdpo"]["components"]
    batch = Batch(
        {
            "token_level_rewards": tensor(INPUTS["rewards"]),
            "response_mask": tensor(INPUTS["mask"]).long(),
        },
        {"uid": INPUTS["groups"], **components},
    )
    args = GDPOArgs(gdpo_reward_keys=list(components), gdpo_reward_weights=case["weights"])
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=case["norm_by_std"])
    advantages, returns = E.GDPO(config, part_context(options=args)).compute(batch)
    close(advantages, case["advantages"])
    assert torch.equal(advantages, returns)


DPPO_LOSSES = {"dppo_tv": L.DPPOTV, "dppo_kl": L.DPPOKL}


@pytest.mark.parametrize(
    "case",
    FROZEN["dppo"]["cases"],
    ids=lambda c: f"{c['loss']}-{c['clip_ratio_low']}-{c['loss_agg_mode']}",
)
def test_dppo_equals_verl(case):
    frozen = FROZEN["dppo"]
    config = ActorConfig(
        clip_ratio_low=case["clip_ratio_low"],
        clip_ratio_high=case["clip_ratio_high"],
        clip_ratio_c=case["clip_ratio_c"],
    )
    loss = DPPO_LOSSES[case["loss"]](config, part_context())
    log_prob = tensor(frozen["log_prob"]).requires_grad_(True)
    value, metrics = loss(
        old_log_prob=tensor(frozen["old_log_prob"]),
        log_prob=log_prob,
        advantages=tensor(frozen["advantages"]),
        response_mask=tensor(INPUTS["mask"]),
        aggregate=LossAggregator(case["loss_agg_mode"]),
    )
    (gradient,) = torch.autograd.grad(value, log_prob)
    assert float(value.detach()) == pytest.approx(case["value"], rel=1e-5, abs=1e-6)
    close(gradient, case["gradient"])
    for name in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert metrics[name] == pytest.approx(case["metrics"][name], abs=1e-6), name
    # the loss keeps some tokens and drops others in these cases, so the check can fail
    assert 0 < metrics["actor/pg_clipfrac"] < 1


@pytest.mark.parametrize(
    "case",
    FROZEN["icepop"]["cases"],
    ids=lambda c: f"{c['level']}-{c['threshold']}",
)
def test_icepop_and_truncation_weights_equal_verl(case):
    weights, metrics = compute_rollout_is_weights(
        tensor(INPUTS["old_log_probs"]),
        tensor(FROZEN["icepop"]["rollout_log_probs"]),
        tensor(INPUTS["mask"]),
        case["level"],
        case["threshold"],
    )
    close(weights, case["weights"])
    verl = case["metrics"]
    names = ["mean", "max", "min", "ratio_fraction_high", "ratio_fraction_low"]
    if case["level"] == "sequence":
        # verl reports the untruncated extremes there and counts empty responses in the
        # fractions (docs/algorithms.md, where this differs from verl)
        names = ["mean"]
    for name in names:
        assert metrics[f"rollout_corr/rollout_is_{name}"] == pytest.approx(
            verl[f"rollout_is_{name}"], abs=1e-6
        ), name
    if isinstance(case["threshold"], str):
        assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(
            verl["rollout_is_oob_ratio"], abs=1e-6
        )


def test_sum_pi_squared_equals_verl():
    frozen = FROZEN["sum_pi_squared"]
    close(sum_pi_squared(tensor(frozen["logits"])), frozen["values"], atol=1e-6)
