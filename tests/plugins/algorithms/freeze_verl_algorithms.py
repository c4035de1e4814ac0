"""Freeze verl's results for the algorithms it added in 2026 into
``data/verl_2026_algorithms.json``, which ``test_verl_2026_parity.py`` reads to check that
plugrl's parts give verl's numbers on the same inputs: the optimal token baseline (both
alignments), GDPO, the DPPO losses, IcePop's importance weights and the sum of squared
probabilities of a distribution.

Not a test and not run in CI: verl is not a dependency of plugrl. Rerun it by hand after
changing the inputs below, against verl 0.9.1 installed without its dependencies::

    pip install --no-deps --target /tmp/verl-0.9.1 verl==0.9.1 codetiming hydra-core \\
        omegaconf antlr4-python3-runtime==4.9.3 dill pylatexenc tensordict pyvers \\
        cloudpickle orjson
    PYTHONPATH=/tmp/verl-0.9.1 python tests/plugins/algorithms/freeze_verl_algorithms.py

The inputs are drawn from a seeded generator here and stored beside verl's outputs, so the
test feeds plugrl exactly what verl received.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).parent / "data" / "verl_2026_algorithms.json"
VERL_VERSION = "0.9.1"
WIDTH = 7

# response lengths and prompt groups: groups of one, of unequal lengths (one strictly the
# longest: the zero tail), an empty response
LENGTHS = [5, 3, 7, 2, 4, 4, 0, 6, 1]
GROUPS = ["a", "a", "a", "b", "b", "b", "c", "c", "d"]
# tool output inside some responses (0 inside the response): the multi-turn alignment
HOLES = {0: [1], 2: [2, 3], 4: [0]}


def _tensor_lists(values: dict[str, Any]) -> dict[str, Any]:
    return {
        name: value.tolist() if hasattr(value, "tolist") else value
        for name, value in values.items()
    }


def main() -> None:
    import numpy as np
    import torch
    import verl
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits

    if verl.__version__ != VERL_VERSION:
        raise SystemExit(f"found verl {verl.__version__}; freeze against {VERL_VERSION}")
    generator = torch.Generator().manual_seed(0)
    rows = len(LENGTHS)
    mask = torch.zeros(rows, WIDTH)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    holed = mask.clone()
    for row, columns in HOLES.items():
        holed[row, columns] = 0
    index = np.array(GROUPS, dtype=object)
    rewards = torch.zeros(rows, WIDTH)
    scores = torch.randint(0, 3, (rows,), generator=generator).float()
    for row, length in enumerate(LENGTHS):
        if length:
            rewards[row, length - 1] = scores[row]
    # a per-token reward too, so that returns-to-go differ along a response
    dense = torch.randn(rows, WIDTH, generator=generator) * mask
    old_log_probs = -torch.rand(rows, WIDTH, generator=generator) * 3
    sum_pi_squared = torch.rand(rows, WIDTH, generator=generator) * torch.exp(old_log_probs)
    is_weights = (torch.rand(rows, WIDTH, generator=generator) * 2) * mask

    cases: dict[str, Any] = {
        "inputs": _tensor_lists(
            {
                "lengths": LENGTHS,
                "groups": GROUPS,
                "mask": mask,
                "holed_mask": holed,
                "rewards": rewards,
                "dense_rewards": dense,
                "old_log_probs": old_log_probs,
                "sum_pi_squared": sum_pi_squared,
                "rollout_is_weights": is_weights,
            }
        )
    }

    otb = []
    for estimator, name in (
        (core_algos.compute_optimal_token_baseline_advantage, "optimal_token_baseline"),
        (
            core_algos.compute_multi_turn_optimal_token_baseline_advantage,
            "tir_optimal_token_baseline",
        ),
    ):
        for reward_name, reward in (("rewards", rewards), ("dense_rewards", dense)):
            for mask_name in ("mask", "holed_mask"):
                for weighted in (False, True):
                    used = mask if mask_name == "mask" else holed
                    advantages, returns = estimator(
                        token_level_rewards=reward,
                        response_mask=used,
                        index=index,
                        old_log_probs=old_log_probs,
                        sum_pi_squared=sum_pi_squared,
                        rollout_is_weights=is_weights if weighted else None,
                    )
                    otb.append(
                        {
                            "estimator": name,
                            "rewards": reward_name,
                            "mask": mask_name,
                            "weighted": weighted,
                            "advantages": advantages.tolist(),
                            "returns": returns.tolist(),
                        }
                    )
    cases["optimal_token_baseline"] = otb

    # GDPO: two reward components per response, placed by verl at the last valid token
    components = {
        "accuracy_reward": torch.randint(0, 2, (rows,), generator=generator).float(),
        "format_reward": torch.rand(rows, generator=generator).round(decimals=1),
    }
    prompt_length = 3
    attention = torch.cat([torch.ones(rows, prompt_length), mask], dim=1).long()
    batch = {"prompts": torch.zeros(rows, prompt_length), "attention_mask": attention}
    non_tensor = {name: value.numpy() for name, value in components.items()}
    gdpo = []
    for weights in (None, [1.0, 0.5]):
        for norm in (True, False):
            config = OmegaConf.create(
                {"gdpo_reward_keys": list(components), "gdpo_reward_weights": weights}
            )
            advantages, _ = core_algos.compute_gdpo_outcome_advantage(
                token_level_rewards=rewards,
                response_mask=mask,
                index=index,
                norm_adv_by_std_in_grpo=norm,
                config=config,
                non_tensor_batch=non_tensor,
                batch=batch,
            )
            gdpo.append(
                {"weights": weights, "norm_by_std": norm, "advantages": advantages.tolist()}
            )
    cases["gdpo"] = {"components": _tensor_lists(components), "cases": gdpo}

    # DPPO: log-probs of the old and new policy with moves up and down, large and small
    old = -torch.rand(rows, WIDTH, generator=generator) * 2
    new = old + torch.randn(rows, WIDTH, generator=generator) * 0.6
    advantages = torch.randn(rows, WIDTH, generator=generator)
    dppo = []
    for loss_name in ("dppo_tv", "dppo_kl"):
        for low, high, ratio_c in ((0.2, 0.28, 3.0), (0.05, 0.1, 1.5)):
            config = OmegaConf.create(
                {
                    "clip_ratio": 0.2,
                    "clip_ratio_low": low,
                    "clip_ratio_high": high,
                    "clip_ratio_c": ratio_c,
                    "global_batch_info": {},
                }
            )
            for agg in ("token-mean", "seq-mean-token-mean"):
                log_prob = new.clone().requires_grad_(True)
                loss, metrics = core_algos.get_policy_loss_fn(loss_name)(
                    old_log_prob=old,
                    log_prob=log_prob,
                    advantages=advantages,
                    response_mask=mask,
                    loss_agg_mode=agg,
                    config=config,
                )
                (gradient,) = torch.autograd.grad(loss, log_prob)
                dppo.append(
                    {
                        "loss": loss_name,
                        "clip_ratio_low": low,
                        "clip_ratio_high": high,
                        "clip_ratio_c": ratio_c,
                        "loss_agg_mode": agg,
                        "value": float(loss.detach()),
                        "gradient": gradient.tolist(),
                        "metrics": {k: float(v) for k, v in metrics.items()},
                    }
                )
    cases["dppo"] = {
        "old_log_prob": old.tolist(),
        "log_prob": new.tolist(),
        "advantages": advantages.tolist(),
        "cases": dppo,
    }

    # IcePop: the trainer's and the engine's log-probs of the same tokens
    rollout = old_log_probs + torch.randn(rows, WIDTH, generator=generator) * 0.8
    icepop = []
    for level in ("token", "sequence"):
        for threshold in ("0.5_5.0", "0.8_1.5", 2.0):
            weights, metrics = compute_rollout_correction_weights(
                log_ratio=old_log_probs - rollout,
                response_mask=mask,
                rollout_is=level,
                rollout_is_threshold=threshold,
            )
            icepop.append(
                {
                    "level": level,
                    "threshold": threshold,
                    "weights": weights.tolist(),
                    "metrics": {k: float(v) for k, v in metrics.items()},
                }
            )
    cases["icepop"] = {"rollout_log_probs": rollout.tolist(), "cases": icepop}

    # the sum of squared probabilities, from logits of a spread the models give
    logits = torch.randn(3, 4, 50, generator=generator) * 4
    cases["sum_pi_squared"] = {
        "logits": logits.tolist(),
        "values": calculate_sum_pi_squared_from_logits(logits).tolist(),
    }

    frozen = {
        "verl_version": VERL_VERSION,
        "made_by": "tests/plugins/algorithms/freeze_verl_algorithms.py",
        **cases,
    }
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps(frozen) + "\n", encoding="utf-8")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
