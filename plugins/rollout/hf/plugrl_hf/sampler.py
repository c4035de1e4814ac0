"""Picking the next token of every running row, each row with its own sampling parameters.

Which distribution a token is drawn from, and whose log-prob is returned: the softmax of the
logits divided by the row's temperature, after top-k and top-p removed tokens (renormalised
over the kept ones). With ``top_k``/``top_p`` off this is exactly the temperature-scaled model
distribution a trainer computes. Greedy rows (temperature 0) sample from a point mass, so their
log-probs are instead those of the unscaled, unfiltered model distribution.

Seeded draws that do not depend on the batch: every sample row owns a CPU generator (seeded
with :func:`plugrl.parts.rollout.derive_seed` of its request's seed and its sample index) and
draws one uniform per token, in blocks. The token is found by inverse CDF over the row's
probabilities, with the uniform scaled by the row's total mass so that a token of probability
zero can never be picked. A row's tokens therefore depend only on its own logits and its own
uniforms: the same alone or beside other rows, whenever it joined the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from plugrl.api.rollout import SamplingParams

UNIFORM_BLOCK = 64
"""Uniforms a row draws from its generator at a time."""


class UniformStream:
    """The uniforms in [0, 1) of one sample row, from its own CPU generator."""

    __slots__ = ("_block", "_generator", "_next")

    def __init__(self, seed: int) -> None:
        self._generator = torch.Generator().manual_seed(seed)
        self._block: list[float] = []
        self._next = 0

    def next(self) -> float:
        if self._next == len(self._block):
            self._block = torch.rand(
                UNIFORM_BLOCK, generator=self._generator, dtype=torch.float64
            ).tolist()
            self._next = 0
        value = self._block[self._next]
        self._next += 1
        return value


class BatchSampling:
    """The sampling parameters of the rows of a running batch, as tensors, and the pick.

    Built once per change of the batch's rows (not per step). Rows may differ in temperature,
    top-k and top-p; work a batch does not need (sorting for top-p, top-k) is skipped.
    """

    def __init__(self, params: Sequence[SamplingParams], device: torch.device) -> None:
        self.size = len(params)
        greedy = [p.temperature == 0 for p in params]
        self.any_greedy = any(greedy)
        self.any_sampled = not all(greedy)
        self.greedy = torch.tensor(greedy, dtype=torch.bool, device=device)
        # greedy rows take the unscaled, unfiltered distribution (their log-probs)
        self.temperature = torch.tensor(
            [[1.0 if g else p.temperature] for p, g in zip(params, greedy, strict=True)],
            dtype=torch.float32,
            device=device,
        )
        top_k = [0 if g or p.top_k <= 0 else p.top_k for p, g in zip(params, greedy, strict=True)]
        self.max_top_k = max(top_k, default=0)
        self.top_k = torch.tensor(top_k, dtype=torch.long, device=device)
        top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)]
        self.any_top_p = any(value < 1.0 for value in top_p)
        # a row without top-p never drops a token, whatever the rounding of the cumulative sum
        self.top_p = torch.tensor(
            [[value if value < 1.0 else 2.0] for value in top_p], dtype=torch.float32, device=device
        )

    def pick(
        self,
        logits: torch.Tensor,
        uniforms: Sequence[float],
        never: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of every row and its log-prob. ``uniforms`` holds one draw per row
        (ignored for greedy rows). ``never`` (token ids) are never picked, sampled or greedy,
        and the log-prob stays that of the distribution above, with them in it: the model's
        probability of the token, as a trainer computes it (a vision-language model's image
        tokens, which stand for pictures and which a model cannot be trained to write)."""
        scaled = logits.float() / self.temperature
        vocab = scaled.shape[-1]
        if self.max_top_k > 0:
            kth_largest = torch.topk(scaled, min(self.max_top_k, vocab), dim=-1).values
            index = (self.top_k.clamp(min=1) - 1).clamp(max=kth_largest.shape[-1] - 1)
            threshold = kth_largest.gather(-1, index[:, None])
            threshold = threshold.masked_fill((self.top_k <= 0)[:, None], float("-inf"))
            scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
        if self.any_top_p:
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the tokens ranked above it already hold top_p of the mass; the
            # most likely token always stays
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            drop_sorted = mass_before >= self.top_p
            drop_sorted[:, 0] = False
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scaled = scaled.masked_fill(drop, float("-inf"))
        log_dist = torch.log_softmax(scaled, dim=-1)
        pickable = log_dist if never is None else log_dist.index_fill(-1, never, float("-inf"))
        if self.any_sampled:
            cdf = torch.cumsum(pickable.exp(), dim=-1)
            total = cdf[:, -1:]
            u = torch.tensor(uniforms, dtype=torch.float32, device=cdf.device)[:, None]
            # strictly below the total mass, so the pick is a token of probability > 0
            target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
            tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
            if self.any_greedy:
                tokens = torch.where(self.greedy, pickable.argmax(dim=-1), tokens)
        else:
            tokens = pickable.argmax(dim=-1)
        return tokens, log_dist.gather(-1, tokens[:, None]).squeeze(-1)


class StopStringMatcher:
    """Finds stop strings in the text a row's tokens decode to, looking only at the tail that
    can hold a newly completed match."""

    def __init__(self, stop_strings: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.decode = decode
        # a token decodes to at least one byte, so a match of b bytes spans at most b tokens,
        # plus one whose bytes start before it
        self.tail = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0) + 1

    def __bool__(self) -> bool:
        return bool(self.stop_strings)

    def matches(self, token_ids: list[int]) -> bool:
        text = self.decode(token_ids[-self.tail :])
        return any(stop in text for stop in self.stop_strings)


def default_stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The eos ids of the model's generation config and config, and the tokenizer's eos."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, Collection):
            ids.update(int(v) for v in value)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return ids
