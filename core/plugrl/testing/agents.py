"""A scripted :class:`~plugrl.parts.agent.Session`, for testing agent loops and environments
without engines: each model turn is the next reply of a script."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugrl.parts.agent import AgentConfig, Environment, ParsedTurn, Session, ToolCall
from plugrl.parts.rollout import Completion

Reply = str | Completion
"""A scripted model turn: a text (encoded, followed by the eos token) or a whole
:class:`~plugrl.parts.rollout.Completion` (to script an aborted or truncated turn)."""


class ScriptedSession(Session):
    """A session whose model turns are scripted.

    ``replies`` is the list of turns in order, or a function of the turn's index and the token
    ids it continues. A text reply becomes its token ids followed by the tokenizer's eos
    token, each with log-prob ``log_prob`` and version ``weight_version``; a reply longer than
    the turn's ``max_tokens`` is cut there with finish reason ``length``. ``environment`` is a
    function returning a fresh :class:`~plugrl.parts.agent.Environment` for
    :meth:`make_environment`. Every :meth:`generate` call is kept in ``calls`` as
    ``(token_ids, max_tokens)``.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply] | Callable[[int, list[int]], Reply],
        *,
        environment: Callable[[], Environment] | None = None,
        config: AgentConfig | None = None,
        max_response_length: int = 256,
        sample_id: str = "uid-0/0",
        log_prob: float = -0.5,
        weight_version: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config if config is not None else AgentConfig()
        self.max_response_length = max_response_length
        self.sample_id = sample_id
        self.replies = replies
        self.environment = environment
        self.log_prob = log_prob
        self.weight_version = weight_version
        self.calls: list[tuple[list[int], int]] = []

    async def generate(self, token_ids: Sequence[int], max_tokens: int) -> Completion:
        turn = len(self.calls)
        self.calls.append((list(token_ids), max_tokens))
        if callable(self.replies):
            reply = self.replies(turn, list(token_ids))
        else:
            if turn >= len(self.replies):
                raise IndexError(f"the script has {len(self.replies)} replies; turn {turn} asked")
            reply = self.replies[turn]
        if isinstance(reply, Completion):
            return reply
        ids = [
            *self.tokenizer.encode(reply, add_special_tokens=False),
            self.tokenizer.eos_token_id,
        ]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        return Completion(
            token_ids=ids,
            log_probs=[self.log_prob] * len(ids),
            finish_reason=finish,
            weight_version=self.weight_version,
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text)

    async def call_tools(self, calls: Sequence[ToolCall], row: Mapping[str, Any]) -> list[str]:
        return [f"error: no tool named {call.name!r} in a scripted session" for call in calls]

    def make_environment(self) -> Environment:
        if self.environment is None:
            raise ValueError(
                "this ScriptedSession has no environment; pass environment=<a function "
                "returning a fresh Environment>"
            )
        return self.environment()
