"""The token record of a sample whose model calls come from outside: a black-box agent talking
to the OpenAI-compatible endpoint (:mod:`plugrl_openai_agent.endpoint`) sends text, not token ids.

Every call's prompt ids and sampled ids are recorded. A call whose prompt ids extend an earlier
call's prompt and completion token for token continues that call's trajectory: the new prompt's
extra tokens are appended with ``loss_mask`` 0, the completion with ``loss_mask`` 1. Any other
call starts a sequence of its own, so a sample may end as several trajectories.

Text loses token ids twice on the way back: the chat template re-renders an assistant message
the client sends back (a tool call's JSON with other spacing, say), and a text may tokenize
differently from how it was sampled. So the record keeps, for every completion, the text that
stands for it in a rendered prompt and the ids sampled for it; :meth:`SampleRecording.encode`
puts those ids back wherever that text follows the prompt it was sampled after, and a
conversation stays one trajectory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.api.agents import Message, Trajectory

if TYPE_CHECKING:
    from plugrl.parts.rollout import Completion


@attrs.define
class _Sequence:
    trajectory: Trajectory
    updated: int
    """When a call last extended it (the record's call counter): the latest comes last."""

    @property
    def ids(self) -> list[int]:
        return [*self.trajectory.prompt_ids, *self.trajectory.response_ids]


@attrs.frozen
class Budget:
    """What a call continuing ``prompt_ids`` may sample: ``max_tokens`` (0 when nothing), and
    why nothing (``"length"``: the trajectory's response is full; ``"max_turns"``)."""

    max_tokens: int
    limit: str | None = None


class SampleRecording:
    """The sequences one sample's calls made, for :meth:`trajectories`.

    Not thread-safe: use it from one thread (the sample's event loop)."""

    def __init__(self, tokenizer: Any, max_response_length: int, max_turns: int) -> None:
        self.tokenizer = tokenizer
        self.max_response_length = max_response_length
        self.max_turns = max_turns
        self.calls = 0
        """Calls answered by the engines."""
        self.calls_in_flight = 0
        """Calls the engines are sampling: they count against ``max_turns`` already."""
        self.limited_calls = 0
        """Calls answered with nothing because a limit was reached."""
        self.substituted = 0
        """Prompts in which sampled ids replaced the tokenizer's for a completion's text."""
        self._sequences: list[_Sequence] = []
        # text -> the prompt text it followed -> (sampled ids, whether the tokenizer's differ)
        self._spans: dict[str, dict[str, tuple[list[int], bool]]] = {}
        self._pattern: re.Pattern[str] | None = None

    # ----------------------------------------------------------------------------------------
    # Text to ids

    def remember(self, before: str, text: str, token_ids: Sequence[int]) -> None:
        """``text`` stands for the sampled ``token_ids`` in later prompts where it follows
        ``before`` (the prompt text the tokens were sampled after), and only there: the same
        text elsewhere is a user's, tokenized as usual."""
        if text and token_ids:
            sampled = list(token_ids)
            self._spans.setdefault(text, {})[before] = (sampled, sampled != self._encode(text))
            self._pattern = None

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: the remembered ids where a remembered text follows the prompt
        it was sampled after, the tokenizer's elsewhere."""
        if not self._spans:
            return self._encode(text)
        if self._pattern is None:
            # the longest first, so that a completion whose text holds another's wins
            spans = sorted(self._spans, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(span) for span in spans))
        ids: list[int] = []
        start = 0
        substituted = False
        for match in self._pattern.finditer(text):
            found = self._spans[match.group(0)].get(text[: match.start()])
            if found is None:
                continue
            sampled, differs = found
            ids += self._encode(text[start : match.start()])
            substituted = substituted or differs
            ids += sampled
            start = match.end()
        ids += self._encode(text[start:])
        self.substituted += substituted
        return ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    # ----------------------------------------------------------------------------------------
    # Calls

    def budget(self, prompt_ids: Sequence[int], max_tokens: int | None) -> Budget:
        """How many tokens a call with ``prompt_ids`` may sample: what is left of
        ``max_response_length`` in the trajectory it continues (the appended prompt tokens
        count), at most ``max_tokens`` (when the client asked for a number)."""
        if self.calls + self.calls_in_flight >= self.max_turns:
            return Budget(0, "max_turns")
        sequence = self._continued(prompt_ids)
        used = 0 if sequence is None else len(prompt_ids) - len(sequence.trajectory.prompt_ids)
        left = self.max_response_length - used
        if left <= 0:
            return Budget(0, "length")
        return Budget(left if max_tokens is None else min(left, max_tokens))

    def record_limit(self, prompt_ids: Sequence[int], limit: str) -> None:
        """A call with ``prompt_ids`` got nothing because of ``limit``: the trajectory it
        continues (or the latest one) ends with it."""
        self.limited_calls += 1
        sequence = self._continued(prompt_ids) or self._latest()
        if sequence is not None:
            sequence.trajectory.finish_reason = limit

    def record(
        self, prompt_ids: Sequence[int], completion: Completion, messages: list[Message]
    ) -> None:
        """A call: ``prompt_ids`` answered with ``completion``; ``messages`` is the
        conversation with the answer (for the samples dump)."""
        self.calls += 1
        sequence = self._continued(prompt_ids)
        if sequence is None:
            sequence = _Sequence(Trajectory(prompt_ids=list(prompt_ids)), self.calls)
            self._sequences.append(sequence)
        trajectory = sequence.trajectory
        extra = list(prompt_ids[len(sequence.ids) :])
        if extra:
            # appended tokens carry the version of the turn before them
            version = trajectory.token_versions[-1] if trajectory.token_versions else 0
            trajectory.response_ids += extra
            trajectory.loss_mask += [0] * len(extra)
            trajectory.log_probs += [0.0] * len(extra)
            trajectory.token_versions += [version] * len(extra)
        sampled = list(completion.token_ids)
        trajectory.response_ids += sampled
        trajectory.loss_mask += [1] * len(sampled)
        trajectory.log_probs += list(completion.log_probs)
        trajectory.token_versions += list(completion.token_versions)
        if sampled:
            trajectory.turn_ends.append(len(trajectory.response_ids) - 1)
        trajectory.num_turns += 1
        trajectory.finish_reason = completion.finish_reason
        trajectory.weight_version = completion.weight_version
        trajectory.messages = list(messages)
        sequence.updated = self.calls

    def _continued(self, prompt_ids: Sequence[int]) -> _Sequence | None:
        """The longest sequence whose ids ``prompt_ids`` start with."""
        best = None
        for sequence in self._sequences:
            ids = sequence.ids
            extends = len(ids) <= len(prompt_ids) and list(prompt_ids[: len(ids)]) == ids
            if extends and (best is None or len(ids) > len(best.ids)):
                best = sequence
        return best

    def _latest(self) -> _Sequence | None:
        return max(self._sequences, key=lambda s: s.updated, default=None)

    # ----------------------------------------------------------------------------------------
    # Results

    def trajectories(self) -> list[Trajectory]:
        """The sequences, the one a call extended last at the end."""
        return [s.trajectory for s in sorted(self._sequences, key=lambda s: s.updated)]

    def metrics(self) -> dict[str, float]:
        """Figures of the sample: calls answered, calls a limit answered with nothing,
        sequences, prompts where sampled ids replaced re-tokenized text."""
        return {
            "endpoint_calls": float(self.calls),
            "endpoint_limited_calls": float(self.limited_calls),
            "endpoint_sequences": float(len(self._sequences)),
            "endpoint_substituted_prompts": float(self.substituted),
        }


def rendered_span(
    prompt_text: str, full_text: str, token_ids: Sequence[int], tokenizer: Any
) -> str:
    """The text that stands for the sampled ``token_ids`` in later prompts: the part of the
    template's rendering of the answer (``full_text`` is the conversation with the answer,
    ``prompt_text`` without it, generation prompt included) that the sampled tokens make.

    When the sampled text begins the rendering, it is that text. Otherwise the template wrote
    the answer its own way: the rendering up to the sampled end-of-turn token when the answer
    ended with one, else up to the template's own closing special token."""
    sampled = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    if not full_text.startswith(prompt_text):
        return sampled  # the template rewrote the history: only the sampled text is known
    rendering = full_text[len(prompt_text) :]
    if rendering.startswith(sampled):
        return sampled
    specials = {str(t) for t in tokenizer.all_special_tokens if t}
    last = tokenizer.decode([token_ids[-1]], skip_special_tokens=False) if token_ids else ""
    if last in specials and last in rendering:
        return rendering[: rendering.rindex(last) + len(last)]
    closing = max((rendering.rfind(t) for t in specials), default=-1)
    return rendering[:closing] if closing > 0 else rendering
