"""The actor objective's gradient (and metrics) must not depend on how a mini-batch is split
into micro-batches and data-parallel ranks."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrl.algorithms.functional import LOSS_AGG_MODES, count_valid
from plugrl.algorithms.objective import PolicyObjective
from plugrl.data.batch import Batch
from plugrl.parts.algorithm import LossScale
from plugrl.recipe import apply_overrides, build_recipe

# clip_cov and kl_cov rank tokens within the micro-batch by design, so they are left out
SPLIT_FREE_LOSSES = ["vanilla", "gspo", "cispo", "reinforce", "geo_mean"]
KL_TYPES = [None, "kl", "abs", "mse", "low_var_kl", "low_var_kl+", "kl+"]


def split_points(draw, size: int, parts: int) -> list[int]:
    """``parts`` consecutive non-empty chunks of ``range(size)`` as boundaries."""
    if parts == 1:
        return [0, size]
    cuts = draw(
        st.lists(st.integers(1, size - 1), min_size=parts - 1, max_size=parts - 1, unique=True)
    )
    return [0, *sorted(cuts), size]


@st.composite
def cases(draw):
    rows = draw(st.integers(1, 8))
    width = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    dp_size = draw(st.integers(1, min(3, rows)))
    ranks = split_points(draw, rows, dp_size)
    micro_batches = []  # per rank: list of (start, stop)
    for start, stop in itertools.pairwise(ranks):
        count = draw(st.integers(1, stop - start))
        bounds = split_points(draw, stop - start, count)
        micro_batches.append([(start + a, start + b) for a, b in itertools.pairwise(bounds)])
    overrides = [
        f"actor.loss_agg_mode={draw(st.sampled_from(LOSS_AGG_MODES))}",
        f"actor.policy_loss={draw(st.sampled_from(SPLIT_FREE_LOSSES))}",
        f"actor.entropy_coeff={draw(st.sampled_from([0.0, 0.01]))}",
        f"algorithm.rollout_is={draw(st.sampled_from(['null', 'token', 'sequence']))}",
        "actor.clip_ratio_high=0.28",
    ]
    kl_type = draw(st.sampled_from(KL_TYPES))
    if kl_type:
        overrides += ["actor.use_kl_loss=true", f"actor.kl_loss_type={kl_type}"]
    seed = draw(st.integers(0, 2**31 - 1))
    return rows, width, lengths, micro_batches, overrides, seed


def make_data(rows, width, lengths, seed):
    generator = torch.Generator().manual_seed(seed)

    def randn(scale=1.0):
        return torch.randn(rows, width, generator=generator, dtype=torch.float64) * scale

    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    old = randn(0.5) - 1.0
    batch = Batch(
        {
            "old_log_probs": old,
            "advantages": randn(),
            "response_mask": mask,
            "ref_log_prob": old + randn(0.3),
            "rollout_log_probs": old + randn(0.3),
        }
    )
    log_prob = (old + randn(0.3)).requires_grad_()
    entropy = (randn().abs() + 0.1).requires_grad_()
    return batch, log_prob, entropy


def gradients(loss, *inputs):
    """d loss / d inputs, zero for an input the loss does not use (no entropy bonus)."""
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads, strict=True)]


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_gradient_and_metrics_do_not_depend_on_the_split(plugins, case):
    rows, width, lengths, micro_batches, overrides, seed = case
    recipe = build_recipe(apply_overrides({}, overrides), plugins)
    objective = PolicyObjective.from_recipe(recipe, plugins)
    batch, log_prob, entropy = make_data(rows, width, lengths, seed)
    num_tokens, num_seqs = count_valid(batch["response_mask"])

    whole_scale = LossScale(num_tokens, num_seqs, dp_size=1, max_response_length=width)
    whole_loss, whole_metrics = objective(batch, log_prob, entropy, whole_scale)
    whole_grads = gradients(whole_loss, log_prob, entropy)

    dp_size = len(micro_batches)
    scale = LossScale(num_tokens, num_seqs, dp_size=dp_size, max_response_length=width)
    summed: dict[str, float] = {}
    accumulated = [torch.zeros_like(log_prob), torch.zeros_like(entropy)]
    for rank in micro_batches:
        for start, stop in rank:
            loss, metrics = objective(
                batch.select(slice(start, stop)), log_prob[start:stop], entropy[start:stop], scale
            )
            for total, grad in zip(accumulated, gradients(loss, log_prob, entropy), strict=True):
                total += grad
            for name, value in metrics.items():
                summed[name] = summed.get(name, 0.0) + value
    # data-parallel ranks average their gradients (and metrics)
    for total, whole in zip(accumulated, whole_grads, strict=True):
        torch.testing.assert_close(total / dp_size, whole, rtol=1e-9, atol=1e-12)
    assert summed.keys() == whole_metrics.keys()
    for name, value in whole_metrics.items():
        assert abs(summed[name] / dp_size - value) <= 1e-9 * (1 + abs(value)), name
