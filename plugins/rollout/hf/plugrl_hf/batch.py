"""The running batch of the ``hf`` engine: the rows being sampled, their cache, one step.

A row is one sample of a request. Its cache holds every token of its sequence (prompt, then
sampled tokens) but the last, which is the row's pending input: a decode step feeds the
pending token of every row, samples the next one from the logits and makes it the new pending
token. A row joins with a prompt pass over its prefix (``sequence[:-1]``), run once for rows
with the same prefix (the ``n`` samples of a request), so its first token is sampled by the
next decode step, beside every other row. The same prompt pass recomputes the cache of rows in
flight when it no longer matches the weights (after a weight update or a sleep): they continue
with what they have sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from plugrl.api.rollout import SamplingParams
from plugrl_hf.kv import DynamicKV, SlotKV, slot_kv_unsupported
from plugrl_hf.sampler import BatchSampling, StopStringMatcher, UniformStream


def _no_uniform() -> float:
    return 0.0


class Row:
    """One sample of a request while it runs."""

    __slots__ = (
        "draw",
        "finish_reason",
        "images",
        "log_probs",
        "matcher",
        "max_tokens",
        "owner",
        "params",
        "prompt",
        "sample_index",
        "stop_ids",
        "tokens",
        "version_marks",
    )

    def __init__(
        self,
        *,
        owner: Any,
        sample_index: int,
        prompt: tuple[int, ...],
        params: SamplingParams,
        seed: int,
        stop_ids: frozenset[int],
        matcher: StopStringMatcher | None,
        version: int,
        images: Any = None,
    ) -> None:
        self.owner = owner
        self.sample_index = sample_index
        self.prompt = prompt
        self.images = images
        """The prompt's image inputs (a vision-language model's request), or ``None``."""
        self.params = params
        self.max_tokens = params.max_tokens
        self.stop_ids = stop_ids
        self.matcher = matcher
        self.draw: Callable[[], float] = (
            UniformStream(seed).next if params.temperature > 0 else _no_uniform
        )
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.version_marks: list[tuple[int, int]] = [(0, version)]
        """``(i, v)``: tokens from index ``i`` on were sampled with weight version ``v``."""
        self.finish_reason: str | None = None

    def mark_version(self, version: int) -> None:
        """Tokens sampled from now on come from ``version``."""
        if self.version_marks[-1][0] == len(self.tokens):
            self.version_marks[-1] = (len(self.tokens), version)
        else:
            self.version_marks.append((len(self.tokens), version))

    def token_versions(self) -> list[int]:
        versions: list[int] = []
        bounds = [index for index, _ in self.version_marks[1:]] + [len(self.tokens)]
        for (index, version), bound in zip(self.version_marks, bounds, strict=True):
            versions += [version] * (bound - index)
        return versions

    def sequence(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.tokens)


def _placeholder_tokens(vision: Any, device: torch.device) -> torch.Tensor | None:
    """The ids of the image and video tokens of a vision-language model's config."""
    if vision is None:
        return None
    config = vision.hf_config
    ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    ids = [int(token) for token in ids if token is not None]
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


class DecodeBatch:
    """The rows being sampled with one model, their KV cache and per-row state."""

    def __init__(
        self,
        model: Any,
        *,
        device: torch.device,
        pad_token_id: int,
        max_rows: int,
        prefill_tokens: int,
        lean_decode: bool = True,
        vision: Any = None,
    ) -> None:
        self.model = model
        self.device = device
        self.max_rows = max_rows
        self.vision = vision
        """A vision-language model's family (its positions), or ``None``."""
        self.never_sampled = _placeholder_tokens(vision, device)
        """The image and video tokens of a vision-language model, never sampled: a response
        holding one could not be trained on (they stand for a picture's inputs); a trained
        checkpoint gives them next to no probability, a tiny test model some."""
        self.fallback_reason = slot_kv_unsupported(model)
        if vision is not None:
            self.fallback_reason = "it is a vision-language model (prompts with images)"
        kind = SlotKV if self.fallback_reason is None else DynamicKV
        self.kv: SlotKV | DynamicKV = kind(
            model,
            device=device,
            pad_token_id=pad_token_id,
            max_slots=max_rows,
            prefill_tokens=prefill_tokens,
            lean_decode=lean_decode,
            **({"vision": vision} if vision is not None else {}),
        )
        self.rows: list[Row] = []
        self.input_ids = torch.empty(0, dtype=torch.long, device=device)
        self.positions = torch.empty(0, dtype=torch.long, device=device)
        self.sampling = BatchSampling([], device)
        self.stale = False
        """The cache does not hold the rows (new weights, or freed): the next step recomputes
        it for every row."""

    @property
    def free_slots(self) -> int:
        if self.rows and not self.stale and not self.kv.merges:
            return 0
        return self.max_rows - len(self.rows)

    def admit(self, rows: list[Row]) -> None:
        """Add rows: one prompt pass per distinct prefix, then their caches join the batch.
        A stale batch recomputes its own rows in the same pass."""
        if self.stale:
            rows = self.rows + rows
            self.rows = []
            self.kv.reset()
            self._clear_row_state()
            self.stale = False
        if not rows:
            return
        # rows share a prompt pass when they have the same prefix and the same images
        groups: dict[tuple[tuple[int, ...], int], list[Row]] = {}
        for row in rows:
            groups.setdefault((row.sequence()[:-1], id(row.images)), []).append(row)
        prefixes = [prefix for prefix, _ in groups]
        members = list(groups.values())
        counts = [len(m) for m in members]
        if self.vision is None:
            order = self.kv.prefill(self.model, prefixes, counts)
            next_positions = [len(prefix) for prefix in prefixes]
        else:
            images = [m[0].images for m in members]
            order, next_positions = self.kv.prefill_with_images(
                self.model, prefixes, counts, images
            )
        taken = [0] * len(members)
        arranged = []
        for group in order:
            arranged.append(members[group][taken[group]])
            taken[group] += 1
        pending = [row.tokens[-1] if row.tokens else row.prompt[-1] for row in arranged]
        positions = [next_positions[group] for group in order]
        self.rows += arranged
        self.input_ids = torch.cat(
            [self.input_ids, torch.tensor(pending, dtype=torch.long, device=self.device)]
        )
        self.positions = torch.cat(
            [self.positions, torch.tensor(positions, dtype=torch.long, device=self.device)]
        )
        self.sampling = BatchSampling([row.params for row in self.rows], self.device)

    def step(self) -> list[Row]:
        """Sample one token for every row; returns the rows that finished (and left)."""
        if self.stale:
            self.admit([])
        logits = self.kv.forward_step(self.model, self.input_ids, self.positions)
        tokens, log_probs = self.sampling.pick(
            logits, [row.draw() for row in self.rows], self.never_sampled
        )
        return self._leave(self._advance(tokens, log_probs))

    def _advance(self, tokens: torch.Tensor, log_probs: torch.Tensor) -> list[int]:
        """Append each row's sampled token; returns the indices of the rows that finished."""
        finished = []
        for index, (row, token, log_prob) in enumerate(
            zip(self.rows, tokens.tolist(), log_probs.tolist(), strict=True)
        ):
            row.tokens.append(token)
            row.log_probs.append(log_prob)
            if token in row.stop_ids or (row.matcher and row.matcher.matches(row.tokens)):
                row.finish_reason = "stop"
            elif len(row.tokens) >= row.max_tokens:
                row.finish_reason = "length"
            else:
                continue
            finished.append(index)
        self.input_ids = tokens
        self.positions += 1
        return finished

    def _leave(self, finished: list[int]) -> list[Row]:
        """Take the finished rows (indices) out; returns them."""
        if not finished:
            return []
        done = [self.rows[i] for i in finished]
        self._remove_at(finished)
        return done

    def remove(self, rows: Iterable[Row]) -> None:
        """Take rows out (aborted)."""
        leaving = {id(row) for row in rows}
        indices = [i for i, row in enumerate(self.rows) if id(row) in leaving]
        if not indices:
            return
        if self.stale:
            self.rows = [row for row in self.rows if id(row) not in leaving]
            return
        self._remove_at(indices)

    def _remove_at(self, indices: list[int]) -> None:
        order = self.kv.remove(indices)
        self.rows = [self.rows[i] for i in order]
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.input_ids = self.input_ids[index]
        self.positions = self.positions[index]
        self.sampling = BatchSampling([row.params for row in self.rows], self.device)

    def invalidate(self, *, free: bool = False) -> None:
        """The cache no longer matches the weights (or is dropped, ``free``): the rows' caches
        are recomputed before their next token."""
        self.kv.reset(free=free)
        self.stale = bool(self.rows)
        if not self.rows:
            self._clear_row_state()

    def weights_changed(self) -> None:
        """The model's weights changed in place: copies made of them are stale."""
        self.kv.weights_changed()

    def clear(self) -> None:
        """Drop every row and the cache (a failed step)."""
        self.rows.clear()
        self.invalidate(free=True)

    def adopt(self, rows: list[Row]) -> None:
        """Take over rows of another batch (a new model); their caches are recomputed."""
        self.rows = list(rows)
        self.stale = bool(self.rows)

    def _clear_row_state(self) -> None:
        self.input_ids = self.input_ids.new_empty(0)
        self.positions = self.positions.new_empty(0)
        self.sampling = BatchSampling([], self.device)
