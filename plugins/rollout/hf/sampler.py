"""Batched sampling with a KV cache over a Hugging Face causal LM's forward.

Prompts are left-padded so that every row's next token sits in the last column; positions come
from the attention mask, so padding never shifts a row's rotary positions. After the prompt
pass, each step feeds one token per running row. A row that finishes (eos or another stop token,
a stop string, ``max_tokens``) leaves the running batch and the KV cache at once, and cache
columns that have become padding for every remaining row are cut, so finished sequences cost
nothing afterwards.

Log-probs are those of the distribution each token was sampled from: the log-softmax of the
logits divided by the temperature, after top-k and top-p removed tokens (renormalised over the
kept ones). With ``top_k``/``top_p`` off this is exactly the temperature-scaled model
distribution a trainer computes. Greedy decoding (temperature 0) samples from a point mass, so
its log-probs are instead those of the unscaled, unfiltered model distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from plugrl.data.batch import left_pad


@attrs.define
class SampledSequence:
    """One response: its tokens, their log-probs, and why it ended."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str


@attrs.frozen
class SamplingSetup:
    """Everything about how to pick tokens, fixed for one call."""

    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...] = ()


def pick_tokens(
    logits: torch.Tensor, setup: SamplingSetup, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob (see the module docstring for which distribution)."""
    logits = logits.float()
    if setup.temperature == 0:
        tokens = logits.argmax(dim=-1)
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, log_probs
    scaled = logits / setup.temperature
    vocab = scaled.shape[-1]
    if 0 < setup.top_k < vocab:
        kth_largest = torch.topk(scaled, setup.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if setup.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass; the
        # most likely token always stays
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= setup.top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    log_dist = torch.log_softmax(scaled, dim=-1)
    tokens = torch.multinomial(log_dist.exp(), 1, generator=generator).squeeze(-1)
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


def _trim_leading_padding(attention_mask: torch.Tensor, cache: Any) -> torch.Tensor:
    """Cut cache columns that are padding for every remaining row (they appear once the
    longest prompts have finished)."""
    lead = int(attention_mask.any(dim=0).to(torch.int8).argmax())
    if lead == 0:
        return attention_mask
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return attention_mask
    for layer in layers:
        layer.keys = layer.keys[:, :, lead:]
        layer.values = layer.values[:, :, lead:]
    return attention_mask[:, lead:]


def _sample_wave(
    model: Any,
    prompts: Sequence[Sequence[int]],
    setup: SamplingSetup,
    *,
    pad_token_id: int,
    device: torch.device,
    generator: torch.Generator | None,
    stop_matcher: StopStringMatcher,
    should_abort: Callable[[], bool],
) -> list[SampledSequence]:
    """Sample ``setup.n`` responses for each prompt, all in one running batch."""
    n, max_tokens = setup.n, setup.max_tokens
    rows = len(prompts) * n
    out_tokens = torch.full((rows, max(max_tokens, 1)), pad_token_id, dtype=torch.long)
    out_log_probs = torch.zeros((rows, max(max_tokens, 1)), dtype=torch.float32)
    lengths = [0] * rows
    reasons: list[str | None] = [None] * rows
    if max_tokens <= 0 or should_abort():
        reason = "length" if max_tokens <= 0 else "aborted"
        return [SampledSequence([], [], reason) for _ in range(rows)]

    input_ids, attention_mask = left_pad(prompts, pad_token_id)
    positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    input_ids, attention_mask, positions = (
        t.to(device) for t in (input_ids, attention_mask, positions)
    )
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=DynamicCache(config=model.config),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = output.past_key_values
    logits = output.logits[:, -1, :]
    next_position = attention_mask.sum(dim=-1)
    if n > 1:
        # the prompt pass ran once per prompt; its cache is shared by the n samples
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
        attention_mask = attention_mask.repeat_interleave(n, dim=0)
        next_position = next_position.repeat_interleave(n, dim=0)
    stop_ids = torch.tensor(sorted(setup.stop_token_ids), dtype=torch.long, device=device)
    running = torch.arange(rows)  # wave row of each running row

    for step in range(max_tokens):
        tokens, log_probs = pick_tokens(logits, setup, generator)
        tokens_cpu = tokens.cpu()
        out_tokens[running, step] = tokens_cpu
        out_log_probs[running, step] = log_probs.float().cpu()
        finished = (
            torch.isin(tokens, stop_ids).cpu()
            if len(stop_ids)
            else torch.zeros_like(tokens_cpu, dtype=torch.bool)
        )
        row_reasons = ["stop" if f else None for f in finished.tolist()]
        if stop_matcher:
            for i, row in enumerate(running.tolist()):
                if row_reasons[i] is None and stop_matcher.matches(
                    out_tokens[row, : step + 1].tolist()
                ):
                    row_reasons[i] = "stop"
        last_step = step + 1 == max_tokens
        aborted = not last_step and should_abort()
        for i, row in enumerate(running.tolist()):
            reason = row_reasons[i]
            if reason is None and (last_step or aborted):
                reason = "length" if last_step else "aborted"
            if reason is not None:
                reasons[row] = reason
                lengths[row] = step + 1
        if last_step or aborted:
            break
        keep = torch.tensor([r is None for r in row_reasons], dtype=torch.bool)
        if not keep.any():
            break
        if not keep.all():
            kept = keep.nonzero().squeeze(-1)
            kept_device = kept.to(device)
            running = running[kept]
            cache.batch_select_indices(kept_device)
            attention_mask = attention_mask[kept_device]
            next_position = next_position[kept_device]
            tokens = tokens[kept_device]
            attention_mask = _trim_leading_padding(attention_mask, cache)
        attention_mask = torch.cat(
            [attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1
        )
        output = model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=next_position[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        cache = output.past_key_values
        logits = output.logits[:, -1, :]
        next_position = next_position + 1

    return [
        SampledSequence(
            out_tokens[row, : lengths[row]].tolist(),
            out_log_probs[row, : lengths[row]].tolist(),
            reasons[row] or "aborted",
        )
        for row in range(rows)
    ]


def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    setup: SamplingSetup,
    *,
    pad_token_id: int,
    device: torch.device | str,
    generator: torch.Generator | None = None,
    max_num_seqs: int = 1024,
    decode: Callable[[list[int]], str] | None = None,
    should_abort: Callable[[], bool] = lambda: False,
) -> list[SampledSequence]:
    """``setup.n`` responses per prompt, grouped by prompt in prompt order.

    Prompts run in waves of at most ``max_num_seqs`` sequences. ``decode`` turns token ids
    into text for stop strings. ``should_abort`` is polled once per step; when it answers
    true, every unfinished response ends with what it has and ``finish_reason="aborted"``.
    Call under ``torch.no_grad()`` with the model in eval mode.
    """
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty; every prompt needs at least one token")
    if setup.stop_strings and decode is None:
        raise ValueError("stop strings need a decode function")
    device = torch.device(device)
    matcher = StopStringMatcher(setup.stop_strings, decode or (lambda ids: ""))
    prompts_per_wave = max(1, max_num_seqs // setup.n)
    results: list[SampledSequence] = []
    for begin in range(0, len(prompts), prompts_per_wave):
        results += _sample_wave(
            model,
            prompts[begin : begin + prompts_per_wave],
            setup,
            pad_token_id=pad_token_id,
            device=device,
            generator=generator,
            stop_matcher=matcher,
            should_abort=should_abort,
        )
    return results


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
