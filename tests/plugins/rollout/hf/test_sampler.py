from __future__ import annotations

import torch

from plugrl.parts.rollout import SamplingParams
from plugrl_hf.sampler import BatchSampling, UniformStream


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a row samples from, computed plainly: temperature, then top-k, then
    top-p (the smallest set of most likely tokens holding top_p of the mass), renormalised."""
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_k > 0:
        kth = torch.sort(probs, descending=True).values[params.top_k - 1]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum()
    if params.top_p < 1.0:
        kept = torch.zeros_like(probs)
        mass = 0.0
        for index in torch.argsort(probs, descending=True).tolist():
            if mass >= params.top_p:
                break
            kept[index] = probs[index]
            mass += float(probs[index])
        probs = kept / kept.sum()
    return probs


def test_stratified_uniforms_reproduce_the_distribution():
    # inverse-CDF sampling maps evenly spaced uniforms onto each token in proportion to its
    # probability: the counts are the probabilities times the draws, up to rounding
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0)) * 2
    draws = 10_000
    for params in (
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6, top_k=10),
        SamplingParams(temperature=1.4, top_p=0.8),
    ):
        expected = reference_probs(logits, params)
        sampling = BatchSampling([params] * draws, torch.device("cpu"))
        uniforms = [(i + 0.5) / draws for i in range(draws)]
        tokens, log_probs = sampling.pick(logits.expand(draws, -1), uniforms)
        counts = torch.bincount(tokens, minlength=50)
        assert torch.all((counts - expected * draws).abs() <= 2), params
        assert torch.allclose(log_probs.double(), expected[tokens].log(), atol=1e-5)


def test_the_largest_uniforms_never_pick_a_token_of_probability_zero():
    logits = torch.arange(20, dtype=torch.float32)[None].flip(-1)  # the last tokens least likely
    params = [SamplingParams(top_k=5), SamplingParams(top_p=0.5), SamplingParams()]
    sampling = BatchSampling(params, torch.device("cpu"))
    for u in (
        1.0 - 2**-53,
        1.0 - 1e-9,
        float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))),
    ):
        tokens, log_probs = sampling.pick(logits.expand(3, -1), [u] * 3)
        # top-k keeps tokens 0-4, top-p the first few; unfiltered, the last tokens are so
        # unlikely that their cumulative mass rounds to the total, and one of them is picked
        assert tokens[0] == 4 and tokens[1] < 5 and tokens[2] >= 15
        assert torch.isfinite(log_probs).all()


def test_rows_with_different_parameters_pick_as_they_would_alone():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 40, generator=generator) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=2.0, top_k=8, top_p=0.9),
        SamplingParams(temperature=0.0, top_k=2),
    ]
    uniforms = torch.rand(6, generator=generator).tolist()
    together, log_probs = BatchSampling(params, torch.device("cpu")).pick(logits, uniforms)
    for row, p in enumerate(params):
        token, log_prob = BatchSampling([p], torch.device("cpu")).pick(
            logits[row : row + 1], uniforms[row : row + 1]
        )
        assert together[row] == token[0]
        assert torch.allclose(log_probs[row], log_prob[0])
    # greedy rows take the argmax, with the log-prob of the unscaled, unfiltered distribution
    assert together[0] == logits[0].argmax()
    assert torch.allclose(log_probs[5], torch.log_softmax(logits[5], -1).max())


def test_tokens_never_picked_keep_their_place_in_the_log_probs():
    """A vision-language model's image tokens are never picked, even where the model favours
    them, the last token of the vocabulary included; the log-prob of what is picked is the
    model's own, as a trainer computes it."""
    logits = torch.tensor([[0.0, 1.0, 8.0, 0.5, 9.0]]).expand(4, -1)
    never = torch.tensor([2, 4])
    params = [SamplingParams(temperature=0.0)] + [SamplingParams(temperature=1.0)] * 3
    sampling = BatchSampling(params, torch.device("cpu"))
    for u in (0.0, 0.5, 1.0 - 1e-9):
        tokens, log_probs = sampling.pick(logits, [u] * 4, never)
        assert tokens[0] == 1, "greedy takes the likeliest token that may be picked"
        assert all(int(token) in (0, 1, 3) for token in tokens)
        torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1)[0, tokens])
    # inverse CDF over the tokens left: a small uniform takes token 0, a large one token 3
    tokens, _ = sampling.pick(logits, [0.0, 0.0, 0.2, 0.99], never)
    assert tokens[1:].tolist() == [0, 1, 3]


def test_a_uniform_stream_depends_only_on_its_seed():
    a, b = UniformStream(5), UniformStream(5)
    first = [a.next() for _ in range(150)]  # past a block boundary
    assert first == [b.next() for _ in range(150)]
    assert first != [UniformStream(6).next() for _ in range(150)]
    assert all(0.0 <= u < 1.0 for u in first)
