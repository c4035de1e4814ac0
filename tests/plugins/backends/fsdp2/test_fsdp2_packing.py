"""Packed forwards (``actor.use_remove_padding``) against padded ones: the same log-probs,
entropies, values, losses and gradients, and micro-batches cut by real token counts."""

import logging

import attrs
import pytest
import torch
from torch.distributed.tensor import DTensor

from plugrl.errors import RecipeError
from plugrl_fsdp2 import packing
from plugrl_fsdp2.batching import packed_micro_batches
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    make_backend,
    make_batch,
    make_recipe,
)

TOLERANCE = {"atol": 1e-5, "rtol": 0}


class EntropyBonus(TokenMeanReinforce):
    """REINFORCE with an entropy bonus: the entropy's gradient reaches the loss."""

    needs_entropy = True

    def __call__(self, micro_batch, log_prob, entropy, scale):
        loss, metrics = super().__call__(micro_batch, log_prob, entropy, scale)
        bonus = (entropy * micro_batch["response_mask"]).sum() * scale.dp_size / scale.num_tokens
        return loss - 0.1 * bonus, {**metrics, "actor/entropy_bonus": float(bonus.detach())}


def _pair(tiny_model, role="actor", **actor):
    """The same backend packed and padded."""
    return tuple(
        make_backend(make_recipe(tiny_model, use_remove_padding=packed, **actor), role=role)
        for packed in (True, False)
    )


def _update_gradients(backend, update):
    """The gradients (full tensors) and metrics of one update call."""
    gradients = {}
    step = backend._clip_and_step

    def capture(grad_clip):
        for name, parameter in backend.model.named_parameters():
            grad = parameter.grad
            gradients[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).clone()
        return step(grad_clip)

    backend._clip_and_step = capture
    metrics = update(backend)
    return gradients, metrics


def _assert_same_gradients(packed, padded):
    assert packed.keys() == padded.keys() and packed
    for name in packed:
        torch.testing.assert_close(packed[name], padded[name], **TOLERANCE, msg=name)


# ---------------------------------------------------------------------------- the layout


def test_pack_lays_the_attended_tokens_of_each_row_end_to_end():
    # prompt width 3, response width 3: row 0 full, row 1 short prompt and response
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
    layout = packing.pack(mask, 3)
    assert layout.token_index.tolist() == [0, 1, 2, 3, 4, 5, 8, 9]
    assert layout.cu_seq_lens.tolist() == [0, 6, 8]
    assert layout.max_length == 6
    ids = torch.arange(12).reshape(2, 6)
    assert layout.gather(ids).tolist() == [[0, 1, 2, 3, 4, 5, 8, 9]]
    # outputs at columns 2, 3, 4 of row 0 (packed 2, 3, 4) and 2, 3 of row 1 (packed 6, 7)
    assert layout.keep.tolist() == [2, 3, 4, 6, 7]
    assert layout.response_index[0].tolist() == [0, 1, 2]
    assert layout.response_index[1, :1].tolist() == [3]
    assert layout.response_len == 3


def test_pack_keeps_the_last_prompt_output_of_a_row_without_response():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 0]])
    layout = packing.pack(mask, 2)
    assert layout.response_len == 1
    assert layout.keep.tolist() == [1, 2]
    assert layout.response_index.tolist() == [[0], [1]]


# ---------------------------------------------------------------------- token budget


@pytest.mark.parametrize("budget", [9, 20, 33, 100])
def test_packed_micro_batches_count_real_tokens(budget):
    lengths = [9, 1, 4, 7, 2, 2, 8, 3, 5, 6]
    groups = packed_micro_batches(lengths, budget)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in group) <= budget for group in groups)
    # the fewest a sum of 47 tokens allows, whatever the lengths
    assert len(groups) == -(-47 // budget)


def test_packed_micro_batches_fill_the_budget_with_rows_of_any_length():
    # padded, the 10-token rows would cost 4 x 10 in any micro-batch of four rows
    groups = packed_micro_batches([10, 1, 10, 1, 10, 1, 10, 1], 22)
    assert len(groups) == 2
    assert sorted(sum([10, 1, 10, 1, 10, 1, 10, 1][i] for i in g) for g in groups) == [22, 22]


def test_packed_micro_batches_honour_an_agreed_minimum_count():
    groups = packed_micro_batches([3] * 6, 100, min_micro_batches=4)
    assert len(groups) == 4
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_a_row_longer_than_the_packed_budget_names_the_key():
    with pytest.raises(RecipeError) as info:
        packed_micro_batches([5, 40, 3], 32)
    assert str(info.value) == (
        "actor.ppo_max_token_len_per_gpu: a sequence of 40 tokens does not fit the micro-batch "
        "token budget of 32; set it to at least the prompt plus response length (40)"
    )


# ---------------------------------------------------------------------- parity


@pytest.mark.parametrize(
    "batching",
    [
        {"ppo_micro_batch_size_per_gpu": 3},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30},
    ],
    ids=["three-rows", "token-budget"],
)
def test_packed_log_probs_and_entropy_equal_the_padded_ones(tiny_model, batching):
    packed, padded = _pair(tiny_model, **batching)
    assert packed._packed and not padded._packed
    batch = make_batch(8, prompt=10, response=7, seed=3)
    got = packed.compute_log_prob(batch, calculate_entropy=True)
    expected = padded.compute_log_prob(batch, calculate_entropy=True)
    torch.testing.assert_close(got["log_probs"], expected["log_probs"], **TOLERANCE)
    torch.testing.assert_close(got["entropys"], expected["entropys"], **TOLERANCE)


def test_the_reference_model_packs_too(tiny_model):
    packed, padded = _pair(tiny_model, role="ref", use_dynamic_bsz=True)
    batch = make_batch(8, seed=4)
    torch.testing.assert_close(
        packed.compute_log_prob(batch)["log_probs"],
        padded.compute_log_prob(batch)["log_probs"],
        **TOLERANCE,
    )


@pytest.mark.parametrize("gradient_checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_packed_update_has_the_padded_losses_and_gradients(tiny_model, gradient_checkpointing):
    batch = make_batch(8, prompt=10, response=7, seed=5)
    results = []
    for packed in (True, False):
        recipe = make_recipe(
            tiny_model,
            use_remove_padding=packed,
            gradient_checkpointing=gradient_checkpointing,
            ppo_micro_batch_size_per_gpu=3,
        )
        backend = make_backend(recipe)
        results.append(
            _update_gradients(backend, lambda b: b.update_policy(batch.copy(), EntropyBonus()))
        )
    (packed_grads, packed_metrics), (padded_grads, padded_metrics) = results
    _assert_same_gradients(packed_grads, padded_grads)
    for name in ("actor/loss", "actor/pg_loss", "actor/entropy_bonus", "actor/grad_norm"):
        assert packed_metrics[name] == pytest.approx(padded_metrics[name], abs=1e-5), name


def test_on_policy_old_log_probs_from_a_packed_update_equal_the_padded_ones(tiny_model):
    batch = make_batch(8, seed=6)
    batch.pop("old_log_probs")
    results = [
        _update_gradients(backend, lambda b: b.update_policy(batch.copy(), TokenMeanReinforce()))
        for backend in _pair(tiny_model, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30)
    ]
    _assert_same_gradients(results[0][0], results[1][0])
    assert results[0][1]["actor/loss"] == pytest.approx(results[1][1]["actor/loss"], abs=1e-5)


def test_packed_critic_values_and_gradients_equal_the_padded_ones(tiny_model):
    packed, padded = _pair(tiny_model, role="critic", ppo_micro_batch_size_per_gpu=3)
    batch = make_batch(8, seed=7)
    torch.testing.assert_close(
        packed.compute_values(batch), padded.compute_values(batch), **TOLERANCE
    )
    got = _update_gradients(packed, lambda b: b.update_critic(batch.copy()))
    expected = _update_gradients(padded, lambda b: b.update_critic(batch.copy()))
    _assert_same_gradients(got[0], expected[0])
    assert got[1]["critic/vf_loss"] == pytest.approx(expected[1]["critic/vf_loss"], abs=1e-5)


# ---------------------------------------------------------------------- around it


def test_the_live_model_keeps_its_own_attention_outside_training(tiny_model):
    backend = make_backend(make_recipe(tiny_model, use_remove_padding=True))
    backend.update_policy(make_batch(8), TokenMeanReinforce())
    backend.compute_log_prob(make_batch(4))
    # a colocated engine generates with the model as loaded
    assert backend.rollout_model().config._attn_implementation == "sdpa"


def test_sliding_window_models_run_padded(tiny_model, caplog):
    recipe = make_recipe(tiny_model, use_remove_padding=True)
    recipe = attrs.evolve(
        recipe,
        model=attrs.evolve(
            recipe.model, override_config={"use_sliding_window": True, "sliding_window": 4}
        ),
    )
    with caplog.at_level(logging.WARNING, logger="plugrl_fsdp2.backend"):
        backend = make_backend(recipe)
    assert not backend._packed
    assert "the actor model runs padded, not packed: it uses sliding-window attention" in (
        caplog.text
    )


def test_packed_attention_refuses_dropout():
    query = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError) as info:
        packing.varlen_attention(
            torch.nn.Module(),
            query,
            query,
            query,
            None,
            dropout=0.1,
            cu_seq_lens_q=torch.tensor([0, 3], dtype=torch.int32),
            max_length_q=3,
        )
    assert str(info.value) == (
        "packed attention runs without dropout; set the model's attention_dropout to 0 "
        "(model.override_config.attention_dropout) or actor.use_remove_padding to false"
    )
