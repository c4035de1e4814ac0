"""The chunked log-probs and entropies against the float32 log-softmax they replace: values
and gradients, chunk sizes that do not divide the tokens, a temperature, bfloat16 logits,
the gradient written over the logits, and torch's gradcheck in float64."""

from __future__ import annotations

import pytest
import torch

from plugrl.algorithms import training
from plugrl.algorithms.log_prob_chunks import chunk_tokens
from plugrl.algorithms.token_log_probs import token_log_probs
from plugrl.data.batch import Batch

TEMPERATURE = 0.7


def reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """The float32 autograd formula: a log-softmax of the whole upcast logits."""
    scaled = logits.float() / temperature
    log_softmax = torch.log_softmax(scaled, dim=-1)
    log_prob = log_softmax.gather(-1, targets[:, None])[:, 0]
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_prob, entropy


def random_case(dtype: torch.dtype, tokens: int = 23, vocab: int = 37, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(tokens, vocab, generator=generator)).to(dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    grad_log_prob = torch.randn(tokens, generator=generator)
    grad_entropy = torch.randn(tokens, generator=generator)
    return logits, targets, grad_log_prob, grad_entropy


def gradients(function, logits, targets, grad_log_prob, grad_entropy):
    """(log_prob, entropy, d(loss)/d(logits)) of ``function``, through a non-leaf copy of the
    logits (the shape the backend hands over: an operation's output)."""
    leaf = logits.clone().requires_grad_()
    log_prob, entropy = function(leaf * 1, targets)
    loss = (log_prob * grad_log_prob).sum() + (entropy * grad_entropy).sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    return log_prob.detach(), entropy.detach(), grad


@pytest.mark.parametrize("chunk", [1, 5, 23, 64])
@pytest.mark.parametrize("overwrite", [False, True])
def test_float32_values_and_gradients_equal_the_log_softmax(chunk, overwrite):
    logits, targets, grad_log_prob, grad_entropy = random_case(torch.float32)

    def chunked(x, y):
        return token_log_probs(
            x, y, TEMPERATURE, with_entropy=True, overwrite_logits=overwrite, chunk=chunk
        )

    expected = gradients(
        lambda x, y: reference(x, y, TEMPERATURE), logits, targets, grad_log_prob, grad_entropy
    )
    got = gradients(chunked, logits, targets, grad_log_prob, grad_entropy)
    for value, want in zip(got, expected, strict=True):
        torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-5)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.float32


@pytest.mark.parametrize("overwrite", [False, True])
def test_bfloat16_logits_give_float32_results_and_a_bfloat16_gradient(overwrite):
    logits, targets, grad_log_prob, grad_entropy = random_case(torch.bfloat16, tokens=31)

    def chunked(x, y):
        return token_log_probs(
            x, y, TEMPERATURE, with_entropy=True, overwrite_logits=overwrite, chunk=8
        )

    # the reference reads the same bfloat16 values, upcast: only the gradient's cast differs
    log_prob, entropy, grad = gradients(chunked, logits, targets, grad_log_prob, grad_entropy)
    want_log_prob, want_entropy, want_grad = gradients(
        lambda x, y: reference(x, y, TEMPERATURE), logits, targets, grad_log_prob, grad_entropy
    )
    assert log_prob.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(log_prob, want_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1.6e-2, atol=1e-5)


def test_the_backward_writes_over_the_logits_only_when_allowed():
    logits, targets, grad_log_prob, _ = random_case(torch.bfloat16)
    for overwrite in (False, True):
        owned = logits.clone().requires_grad_(True) * 1  # an operation's output
        before = owned.detach().clone()
        log_prob, _ = token_log_probs(owned, targets, overwrite_logits=overwrite, chunk=4)
        (grad,) = torch.autograd.grad((log_prob * grad_log_prob).sum(), owned)
        shares = grad.untyped_storage().data_ptr() == owned.untyped_storage().data_ptr()
        assert shares == overwrite
        assert torch.equal(owned.detach(), grad if overwrite else before)


def test_a_second_backward_over_overwritten_logits_is_refused():
    logits, targets, _, _ = random_case(torch.float32)
    owned = logits.clone().requires_grad_(True) * 1
    log_prob, _ = token_log_probs(owned, targets, overwrite_logits=True, chunk=4)
    log_prob.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="overwrite_logits=False"):
        log_prob.sum().backward()


def test_the_metric_entropy_has_no_gradient_and_the_same_values():
    logits, targets, grad_log_prob, _ = random_case(torch.float32)
    leaf = logits.clone().requires_grad_()
    log_prob, entropy = token_log_probs(leaf, targets, 1.3, with_entropy=True, entropy_grad=False)
    assert not entropy.requires_grad and log_prob.requires_grad
    want_log_prob, want_entropy = reference(logits, targets, 1.3)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_prob, want_log_prob, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad((log_prob * grad_log_prob).sum(), leaf)
    want_leaf = logits.clone().requires_grad_()
    (want_grad,) = torch.autograd.grad(
        (reference(want_leaf, targets, 1.3)[0] * grad_log_prob).sum(), want_leaf
    )
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)


def test_gradcheck_in_float64():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    targets = torch.randint(0, 7, (5,), generator=generator)

    def both(x):
        return token_log_probs(x, targets, 0.6, with_entropy=True, chunk=2)

    assert torch.autograd.gradcheck(both, (logits,))


def test_response_log_probs_mask_padding_and_keep_gradients(monkeypatch):
    """Through response_log_probs: padded positions and columns past the used width are 0
    and pass no gradient, over chunks that straddle rows."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 11, generator=generator)
    responses = torch.randint(0, 11, (3, 5), generator=generator)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[0, -2:] = 0
    micro_batch = Batch({"responses": responses, "attention_mask": attention_mask})
    monkeypatch.setattr("plugrl.algorithms.log_prob_chunks.CHUNK_ELEMENTS", 5 * 11)
    leaf = logits.clone().requires_grad_()
    log_prob, entropy = training.response_log_probs(
        leaf * 1, micro_batch, TEMPERATURE, with_entropy=True, overwrite_logits=True
    )
    (log_prob.sum() + entropy.sum()).backward()
    mask = attention_mask[:, -5:][:, :4].float()
    want_leaf = logits.clone().requires_grad_()
    want_log_prob, want_entropy = reference(
        want_leaf.reshape(-1, 11), responses[:, :4].reshape(-1), TEMPERATURE
    )
    want = want_log_prob.reshape(3, 4) * mask, want_entropy.reshape(3, 4) * mask
    (want[0].sum() + want[1].sum()).backward()
    torch.testing.assert_close(log_prob[:, :4], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[:, :4], want[1], rtol=1e-5, atol=1e-5)
    assert (log_prob[:, 4] == 0).all() and (log_prob[0, 3:] == 0).all()
    assert (leaf.grad[0, 3:] == 0).all() and (leaf.grad[0, :3] != 0).any()
    torch.testing.assert_close(leaf.grad, want_leaf.grad, rtol=1e-5, atol=1e-5)


def test_a_chunk_holds_a_fixed_number_of_logits():
    assert chunk_tokens(152_064) * 152_064 <= 32 * 2**20
    assert chunk_tokens(10**9) == 1


@pytest.mark.parametrize(
    "logits, targets, message",
    [
        (torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), "flatten"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), "floating"),
    ],
)
def test_bad_shapes_are_refused_with_a_clear_error(logits, targets, message):
    with pytest.raises(ValueError, match=message):
        token_log_probs(logits, targets)


@pytest.mark.parametrize("overwrite", [False, True])
def test_rows_read_a_model_output_whole_and_leave_the_others_without_gradient(overwrite):
    """Targets of some rows of a [M, V] output, in another order: the rows read equal the
    log-softmax of those rows picked out, the rows no target reads get a zero gradient."""
    logits, targets, grad_log_prob, grad_entropy = random_case(torch.float32, tokens=9)
    rows = torch.tensor([7, 0, 3, 5, 1])
    picked_targets = targets[:5]

    def chunked(x, y):
        return token_log_probs(
            x, y, TEMPERATURE, rows=rows, with_entropy=True, overwrite_logits=overwrite, chunk=2
        )

    def picked(x, y):
        return reference(x[rows], y, TEMPERATURE)

    got = gradients(chunked, logits, picked_targets, grad_log_prob[:5], grad_entropy[:5])
    want = gradients(picked, logits, picked_targets, grad_log_prob[:5], grad_entropy[:5])
    for value, expected in zip(got, want, strict=True):
        torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
    assert (got[2][[2, 4, 6, 8]] == 0).all()


def test_rows_named_twice_cannot_be_overwritten():
    logits, targets, _, _ = random_case(torch.float32)
    rows = torch.tensor([1, 1])
    with pytest.raises(ValueError, match="more than once"):
        token_log_probs(logits, targets[:2], rows=rows, overwrite_logits=True)
    log_prob, _ = token_log_probs(logits, targets[:2], rows=rows)  # reading twice is fine
    assert log_prob.shape == (2,)
