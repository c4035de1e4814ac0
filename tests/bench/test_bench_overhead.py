"""The bare loop of bench/bench_overhead.py computes what plugrl computes: the same GRPO
advantages, the same policy loss, and the log-probs of the response tokens, so that the
comparison cannot drift into one of different work."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.parts.algorithm import LossScale
from tests.bench.test_bench_imports import BENCH


def _load_bench() -> object:
    # registered under its name: its dataclasses look their module up in sys.modules
    name = "bench_overhead"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


bench = _load_bench()


def test_grpo_advantages_equal_the_grpo_estimator():
    from plugrl.plugin.build import build_estimator
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.testing import make_recipe

    n = 4
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.0, 1.0])
    mask = torch.ones(len(scores), 3)
    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = scores
    batch = Batch(
        {
            "token_level_rewards": rewards,
            "response_mask": mask,
            "uid": [f"prompt{row // n}" for row in range(len(scores))],
        }
    )
    recipe = make_recipe({"algorithm.adv_estimator": "grpo"})
    estimator = build_estimator(recipe, get_plugin_manager())
    expected, _ = estimator.compute(batch)

    ours = bench.grpo_advantages(scores, n)

    torch.testing.assert_close(ours[:, None] * mask, expected)
    assert ours[4:8].abs().max() == 0  # an all-equal group teaches nothing


def test_the_clipped_loss_equals_the_actor_objective_over_micro_batches():
    from plugrl.algorithms.objective import PolicyObjective
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.testing import make_recipe

    generator = torch.Generator().manual_seed(0)
    rows, width = 6, 5
    log_prob = torch.randn(rows, width, generator=generator) * 0.3 - 1.0
    old = log_prob + torch.randn(rows, width, generator=generator) * 0.4  # some ratios clip
    advantages = torch.tensor([1.5, -2.0, 0.5, -0.5, 0.0, 3.0])
    lengths = [5, 3, 1, 4, 2, 5]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    recipe = make_recipe({"actor.loss_agg_mode": "token-mean", "actor.policy_loss": "vanilla"})
    actor = recipe.actor
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    scale = LossScale(num_tokens=sum(lengths), num_seqs=rows, dp_size=1)
    for micro in ([0, 1, 2], [3, 4, 5]):
        micro_batch = Batch(
            {
                "old_log_probs": old[micro],
                "advantages": advantages[micro, None] * mask[micro],
                "response_mask": mask[micro],
            }
        )
        expected, _ = objective(micro_batch, log_prob[micro], None, scale)

        ours = bench.clipped_token_mean_loss(
            log_prob[micro],
            old[micro],
            advantages[micro],
            mask[micro],
            sum(lengths),
            clip_low=actor.effective_clip_low,
            clip_high=actor.effective_clip_high,
            dual_clip=actor.clip_ratio_c,
        )

        torch.testing.assert_close(ours, expected)


def test_log_probs_of_a_micro_batch_equal_each_row_alone():
    from plugrl.testing.tiny import make_tiny_model

    model = make_tiny_model(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2
    ).eval()
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    responses = [[12, 13], [14, 15, 16, 17, 18], [19]]
    batch = bench.micro_batch(prompts, responses, pad_token_id=0)

    with torch.no_grad():
        ours = bench.token_log_probs(model, batch, temperature=0.7)
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            ids = torch.tensor([prompt + response])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
            alone = logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
            torch.testing.assert_close(ours[row, : len(response)], alone, atol=1e-5, rtol=1e-5)
            assert ours[row, len(response) :].abs().sum() == 0
    assert batch.mask.sum() == sum(len(r) for r in responses)


@pytest.mark.parametrize(
    ("plugrl", "bare", "phase"),
    [
        (
            {"gen": 1.0, "update": 2.0, "other": 0.3},
            {"gen": 0.6, "update": 1.9, "other": 0.1},
            "gen",
        ),
        (
            {"gen": 1.0, "update": 2.5, "other": 0.1},
            {"gen": 1.0, "update": 2.0, "other": 0.1},
            "update",
        ),
    ],
)
def test_the_report_names_the_phase_of_the_overhead(plugrl, bare, phase):
    full = {name: 0.0 for name in bench.PHASES}
    assert bench.overhead_phase({**full, **plugrl}, {**full, **bare}) == phase
