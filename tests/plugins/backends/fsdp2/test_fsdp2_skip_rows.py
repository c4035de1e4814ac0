"""Sequences with all-zero advantages left out of the actor update
(``actor.skip_zero_advantage_rows``): the same loss, gradients and weights as running every
sequence, on one rank and on two, with metrics averaged over the sequences that ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from plugrl.algorithms.objective import PolicyObjective
from plugrl.cluster.distributed import free_port
from plugrl.data.batch import Batch
from plugrl.parts.context import DistInfo, PartContext
from plugrl.plugin.manager import get_plugin_manager
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
)
from tests.support import spawned_rank

TOLERANCE = {"atol": 2e-6, "rtol": 0}
ZERO_ROWS = [1, 4, 5]
LAYOUTS = {
    "fixed micro-batches": {"ppo_micro_batch_size_per_gpu": 3},
    "token budget": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30},
    "packed": {"use_remove_padding": True, "ppo_micro_batch_size_per_gpu": 3},
}


def zeroed(batch: Batch, rows: list[int]) -> Batch:
    batch = batch.copy()
    advantages = batch["advantages"].clone()
    advantages[rows] = 0.0
    batch["advantages"] = advantages
    return batch


def update(backend: FSDP2Backend, batch: Batch) -> tuple[dict[str, torch.Tensor], dict]:
    """One update with the recipe's objective: the gradients it stepped with, and metrics."""
    gradients: dict[str, torch.Tensor] = {}
    step = backend._clip_and_step

    def capture(grad_clip: float) -> float:
        assert backend.model is not None
        for name, parameter in backend.model.named_parameters():
            grad = parameter.grad
            full = grad.full_tensor() if isinstance(grad, DTensor) else grad
            gradients[name] = full.clone()
        return step(grad_clip)

    backend._clip_and_step = capture  # type: ignore[method-assign]
    objective = PolicyObjective.from_recipe(backend.recipe, get_plugin_manager())
    metrics = backend.update_policy(batch.copy(), objective)
    backend._clip_and_step = step  # type: ignore[method-assign]
    return gradients, metrics


def both(tiny_model: Path, **actor: Any) -> tuple[FSDP2Backend, FSDP2Backend]:
    """The same actor with rows skipped, and with every row run."""
    return tuple(  # type: ignore[return-value]
        make_backend(make_recipe(tiny_model, skip_zero_advantage_rows=skip, **actor))
        for skip in (True, False)
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("on_policy", [True, False], ids=["own-forward", "old-log-probs"])
def test_skipping_zero_advantage_rows_keeps_loss_gradients_and_weights(
    tiny_model, layout, on_policy
):
    batch = zeroed(make_batch(8, prompt=10, response=7, seed=3), ZERO_ROWS)
    skipping, running = both(tiny_model, **LAYOUTS[layout])
    if on_policy:
        batch.pop("old_log_probs")
    else:
        # off the old weights a little, so ratios differ from 1 and some clip
        old = running.compute_log_prob(batch)["log_probs"]
        batch["old_log_probs"] = old + 0.3 * torch.randn(old.shape, generator=torch.Generator())
    skipped_grads, skipped_metrics = update(skipping, batch)
    full_grads, full_metrics = update(running, batch)

    assert skipped_grads.keys() == full_grads.keys() and skipped_grads
    for name in full_grads:
        torch.testing.assert_close(skipped_grads[name], full_grads[name], **TOLERANCE, msg=name)
    # Adam's first step divides each gradient by its own size, so a gradient near zero turns
    # summation-order noise into up to a step's worth (lr 1e-3) of difference; 2% of that
    assert max_weight_difference(full_weights(skipping), full_weights(running)) < 2e-5
    for name in ("actor/loss", "actor/pg_loss", "actor/grad_norm"):
        assert skipped_metrics[name] == pytest.approx(full_metrics[name], abs=1e-6), name
    assert skipped_metrics["actor/skipped_rows"] == pytest.approx(len(ZERO_ROWS) / 8)
    assert "actor/skipped_rows" not in full_metrics


def test_metrics_are_means_over_the_rows_that_ran(tiny_model):
    batch = zeroed(make_batch(8, prompt=10, response=7, seed=4), ZERO_ROWS)
    batch.pop("old_log_probs")
    skipping, _ = both(tiny_model, ppo_micro_batch_size_per_gpu=3)
    scored = skipping.compute_log_prob(batch, calculate_entropy=True)
    kept = [row for row in range(8) if row not in ZERO_ROWS]
    mask = batch["response_mask"][kept].float()
    expected = float((scored["entropys"][kept] * mask).sum() / mask.sum())

    _, metrics = update(skipping, batch)
    assert metrics["actor/entropy"] == pytest.approx(expected, abs=1e-5)
    # the update's own forward took its old log-probs: nothing clipped, no drift
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-7)


def test_a_mini_batch_without_any_advantage_still_steps_the_optimizer(tiny_model):
    """Adam moves the weights by its momentum on a zero gradient: the step is still taken (one
    row runs, with a zero gradient), as running every row would take it."""
    first = make_batch(8, seed=5)
    first.pop("old_log_probs")
    silent = zeroed(first, list(range(8)))
    skipping, running = both(tiny_model, ppo_micro_batch_size_per_gpu=3)
    for backend in (skipping, running):
        update(backend, first)
    before = full_weights(skipping)
    grads, metrics = update(skipping, silent)
    update(running, silent)

    assert all(float(grad.abs().max()) == 0.0 for grad in grads.values())
    assert metrics["actor/skipped_rows"] == pytest.approx(7 / 8)
    assert max_weight_difference(before, full_weights(skipping)) > 1e-5
    assert max_weight_difference(full_weights(skipping), full_weights(running)) < 1e-6


# ---------------------------------------------------------------------------- two ranks


def two_rank_worker(rank: int, world_size: int, port: int, model_dir: str, out: str) -> None:
    """Rank 0's rows all have zero advantages, rank 1's some: both run as many rows (one
    forward gathers weights from every rank), and the step equals running every row."""
    from plugrl.cluster.distributed import init_process_group

    torch.set_num_threads(1)
    dist_info = DistInfo(rank=rank, world_size=world_size)
    init_process_group(CpuDevice(), dist_info, "127.0.0.1", port)
    with spawned_rank():
        results = {}
        for skip in (True, False):
            for layout, options in LAYOUTS.items():
                recipe = make_recipe(
                    Path(model_dir),
                    skip_zero_advantage_rows=skip,
                    ppo_mini_batch_size=8 * world_size,
                    **options,
                )
                context = PartContext(
                    recipe=recipe, role="actor", device=CpuDevice(), dist=dist_info
                )
                backend = FSDP2Backend(recipe.actor, context)
                backend.setup(10)
                batch = make_batch(8, prompt=10, response=7, seed=10 + rank)
                batch.pop("old_log_probs")
                batch = zeroed(batch, list(range(8)) if rank == 0 else ZERO_ROWS)
                grads, metrics = update(backend, batch)
                results[(skip, layout)] = {
                    "grads": grads,
                    "metrics": metrics,
                    "weights": full_weights(backend),  # gathered on rank 0 only
                }
        torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("skip-rows")
    mp.spawn(
        two_rank_worker,
        args=(2, free_port(), str(tiny_model), str(out)),
        nprocs=2,
        join=True,
    )
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_ranks_skip_unevenly_and_step_as_running_every_row(two_ranks, layout):
    for rank, results in enumerate(two_ranks):
        skipped, full = results[(True, layout)], results[(False, layout)]
        for name, grad in full["grads"].items():
            torch.testing.assert_close(skipped["grads"][name], grad, **TOLERANCE, msg=name)
        if rank == 0:
            # see the one-rank test on Adam's first step; this is a tenth of a step
            assert max_weight_difference(skipped["weights"], full["weights"]) < 1e-4
        for name in ("actor/loss", "actor/grad_norm"):
            assert skipped["metrics"][name] == pytest.approx(full["metrics"][name], abs=1e-6), (
                rank,
                name,
            )
    # rank 1 has five rows with a gradient, so rank 0 runs five of its eight as well
    assert two_ranks[0][(True, layout)]["metrics"]["actor/skipped_rows"] == pytest.approx(3 / 8)
    assert two_ranks[1][(True, layout)]["metrics"]["actor/skipped_rows"] == pytest.approx(3 / 8)
