"""Two spawned ranks with gloo: data parallelism (2 copies) and tensor parallelism (1 copy cut
in two) each give the one-rank results."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from plugrl.cluster.distributed import free_port
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    make_backend,
    make_batch,
    make_recipe,
)
from tests.plugins.backends.megatron.megatron_testing import rank_update_worker

pytestmark = pytest.mark.slow

# AdamW divides each gradient element by its own magnitude, so an element whose gradient is
# near zero turns a float32 difference in summation order (tensor-parallel matmul pieces,
# data-parallel reduction) into up to ~1e-4 of weight; the step moves weights by ~1e-3
WEIGHT_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def one_rank_update(tiny_model):
    """The fsdp2 backend's update of the whole batch on one rank: the reference."""
    backend = make_backend(make_recipe(tiny_model))
    log_probs = backend.compute_log_prob(make_batch(8))["log_probs"]
    metrics = backend.update_policy(make_batch(8), TokenMeanReinforce())
    weights = {name: tensor.clone() for name, tensor in backend.named_weights()}
    return log_probs, metrics, weights


def test_two_ranks_give_the_one_rank_log_probs_and_update(tiny_model, tmp_path, one_rank_update):
    mp.spawn(
        rank_update_worker,
        args=(2, free_port(), str(tiny_model), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    # (dp_rank, dp_size, is_output_rank): with tp 2 only the first tensor-parallel rank
    # holds outputs for the worker group
    layouts = {1: [(0, 2, 1), (1, 2, 1)], 2: [(0, 1, 1), (0, 1, 0)]}
    for tp, expected_layout in layouts.items():
        check_ranks(tmp_path, tp, expected_layout, one_rank_update)


def check_ranks(folder, tp, layout, one_rank_update):
    expected_log_probs, expected_metrics, expected_weights = one_rank_update
    results = [torch.load(folder / f"tp{tp}_rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert [tuple(int(v) for v in result["dp"]) for result in results] == layout
    for result in results:
        torch.testing.assert_close(
            result["log_probs"], expected_log_probs[result["rows"]], atol=1e-5, rtol=0
        )
    assert results[1]["weights"] == {}  # only rank 0 yields weights
    weights = results[0]["weights"]
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=WEIGHT_TOLERANCE, rtol=0)
    grad_norm = results[0]["metrics"]["actor/grad_norm"]
    assert grad_norm == pytest.approx(expected_metrics["actor/grad_norm"], rel=1e-4), tp
