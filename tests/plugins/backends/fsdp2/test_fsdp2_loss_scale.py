"""The fsdp2 backend's ``LossScale``: ``seq-mean-token-sum-norm`` divides by a constant of the
run (``actor.loss_scale_factor``, else ``data.max_response_length``), never by the batch's
longest response, and the aggregation equals verl 0.9.1's on the same responses (values frozen
by ``freeze_verl_agg_loss.py`` in this folder)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch

from plugrl.algorithms.functional import LossAggregator
from plugrl.data.batch import Batch
from plugrl.parts.algorithm import LossScale
from plugrl.parts.context import DistInfo, PartContext
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_batch, make_recipe

FROZEN = json.loads((Path(__file__).parent / "data" / "verl_agg_loss.json").read_text("utf-8"))
MAX_LEN = FROZEN["max_response_length"]


def unset_backend(tmp_path: Path, max_response_length: int, **actor) -> FSDP2Backend:
    """An actor backend that has not loaded a model: enough for its loss scale."""
    recipe = make_recipe(tmp_path, **actor)
    recipe.data = attrs.evolve(recipe.data, max_response_length=max_response_length)
    context = PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo())
    return FSDP2Backend(recipe.actor, context)


def frozen_batch(name: str, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss values, response mask) of a frozen batch, padded to ``width`` (default: its
    longest response, as plugrl's rollout pads)."""
    batch = FROZEN["batches"][name]
    lengths = batch["lengths"]
    width = width or max(lengths)
    values = torch.tensor(batch["loss_mat"])[:, :width]
    mask = torch.zeros(len(lengths), width)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return values, mask


def sum_norm(backend: FSDP2Backend, values: torch.Tensor, mask: torch.Tensor) -> float:
    scale = backend._loss_scale(Batch({"response_mask": mask}))
    return float(LossAggregator("seq-mean-token-sum-norm", scale)(values, mask))


@pytest.mark.parametrize(
    "case", FROZEN["cases"], ids=lambda c: f"{c['batch']}-{c['mode']}-{c['loss_scale_factor']}"
)
def test_aggregation_equals_verl_on_the_same_responses(tmp_path, case):
    factor = case["loss_scale_factor"]
    backend = unset_backend(tmp_path, MAX_LEN, loss_scale_factor=factor)
    # verl's batch is padded to max_response_length; plugrl's to the longest response
    values, mask = frozen_batch(case["batch"])
    assert mask.shape[-1] < MAX_LEN
    scale = backend._loss_scale(Batch({"response_mask": mask}))
    value = float(LossAggregator(case["mode"], scale)(values, mask))
    assert value == pytest.approx(case["value"], rel=1e-6, abs=1e-9)


def test_the_normaliser_does_not_depend_on_the_longest_response(tmp_path):
    backend = unset_backend(tmp_path, MAX_LEN)
    values, mask = frozen_batch("long")
    longest = mask.shape[-1]
    results = [sum_norm(backend, *frozen_batch("long", width)) for width in (longest, 13, MAX_LEN)]
    assert results == pytest.approx([results[0]] * 3, rel=1e-6)
    scales = {
        backend._loss_scale(Batch({"response_mask": frozen_batch(name)[1]})).max_response_length
        for name in FROZEN["batches"]
    }
    assert scales == {MAX_LEN}
    # the sum of the responses' token sums over the responses, over the constant
    per_response = (values * mask).sum(-1)
    expected = float(per_response.sum() / (mask.sum(-1) > 0).sum() / MAX_LEN)
    assert results[0] == pytest.approx(expected, rel=1e-6)


def test_loss_scale_factor_replaces_the_max_response_length(tmp_path):
    backend = unset_backend(tmp_path, MAX_LEN, loss_scale_factor=4096)
    scale = backend._loss_scale(Batch({"response_mask": frozen_batch("short")[1]}))
    assert scale == LossScale(
        num_tokens=9, num_seqs=4, dp_size=1, max_response_length=MAX_LEN, loss_scale_factor=4096
    )
    values, mask = frozen_batch("short")
    unscaled = unset_backend(tmp_path, MAX_LEN)
    assert sum_norm(backend, values, mask) == pytest.approx(
        sum_norm(unscaled, values, mask) * MAX_LEN / 4096, rel=1e-6
    )


def test_micro_batches_of_their_own_widths_add_up_to_the_whole(tmp_path):
    backend = unset_backend(tmp_path, MAX_LEN)
    values, mask = frozen_batch("long")
    scale = backend._loss_scale(Batch({"response_mask": mask}))
    aggregate = LossAggregator("seq-mean-token-sum-norm", scale)
    parts = []
    for rows in ([0, 1, 2], [3, 4, 5]):
        width = int(mask[rows].sum(-1).max())  # each micro-batch trimmed to its own longest
        parts.append(aggregate(values[rows, :width], mask[rows, :width]))
    assert float(sum(parts)) == pytest.approx(float(aggregate(values, mask)), rel=1e-6)


class RecordScale:
    """An objective that records the LossScale the backend hands it."""

    needs_entropy = False
    needs_ref = False

    def __init__(self) -> None:
        self.scales: list[LossScale] = []

    def __call__(self, micro_batch, log_prob, entropy, scale):
        self.scales.append(scale)
        loss = (log_prob * micro_batch["response_mask"]).sum() * 0.0
        return loss, {}


def test_the_update_hands_the_objective_the_run_constant(tiny_model):
    recipe = make_recipe(tiny_model, loss_scale_factor=None, ppo_mini_batch_size=4)
    recipe.data = attrs.evolve(recipe.data, max_response_length=MAX_LEN)
    backend = make_backend(recipe)
    objective = RecordScale()
    for response in (3, 9):  # two steps whose longest responses differ
        backend.update_policy(make_batch(4, response=response), objective)
    assert {scale.max_response_length for scale in objective.scales} == {MAX_LEN}
    assert {scale.loss_scale_factor for scale in objective.scales} == {None}
