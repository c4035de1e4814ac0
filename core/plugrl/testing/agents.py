"""A scripted :class:`~plugrl.parts.agent.Session`, for testing agent loops, tools and
environments without engines: each model turn is the next reply of a script, and the tools
the session offers run through the run's own tool-calling path.

A test of a tool through the built-in ``tool`` loop, with a scripted model that calls it::

    from plugrl.testing import ScriptedSession, make_tiny_tokenizer, part_context, tool_call_text

    tokenizer = make_tiny_tokenizer()
    session = ScriptedSession(
        tokenizer,
        [tool_call_text("add", {"a": 1, "b": 2}), "It is 3."],
        tools=[AddTool(None, part_context())],
    )
    loop = ToolLoop(None, part_context())
    trajectory = asyncio.run(loop.run({"prompt": [...], "uid": "u"}, session))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from plugrl.parts.agent import (
    AgentConfig,
    Environment,
    ParsedTurn,
    Session,
    Tool,
    ToolCall,
    ToolCallParser,
    ToolResult,
)
from plugrl.parts.rollout import Completion

if TYPE_CHECKING:
    from plugrl.agents.session import ToolCaller
    from plugrl.plugin.manager import PluginManager

Reply = str | Completion
"""A scripted model turn: a text (encoded, followed by the eos token) or a whole
:class:`~plugrl.parts.rollout.Completion` (to script an aborted or truncated turn)."""

CALL_FORMATS = ("hermes", "llama3_json", "gpt-oss")
"""The tool-call formats :func:`tool_call_text` writes (the built-in parsers' names)."""


def tool_call_text(name: str, arguments: Mapping[str, Any], *, format: str = "hermes") -> str:
    """The text of a model turn calling tool ``name`` with ``arguments``, as a model taught
    the chat format ``format`` writes it, for a scripted reply: ``hermes``
    (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), ``llama3_json``
    (``{"name": ..., "parameters": {...}}``) or ``gpt-oss`` (a harmony message to
    ``functions.<name>``). Join several with ``"\\n"`` (``";"`` for ``llama3_json``) for a
    turn of parallel calls."""
    if format == "hermes":
        payload = json.dumps({"name": name, "arguments": dict(arguments)})
        return f"<tool_call>\n{payload}\n</tool_call>"
    if format == "llama3_json":
        return json.dumps({"name": name, "parameters": dict(arguments)})
    if format in ("gpt-oss", "harmony"):
        return (
            f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
            f"{json.dumps(dict(arguments))}<|call|>"
        )
    raise ValueError(
        f"tool_call_text writes the formats {', '.join(CALL_FORMATS)}, not {format!r}; for "
        "another parser, script the turn's text as its model writes it"
    )


class ScriptedSession(Session):
    """A session whose model turns are scripted, and whose tools are real.

    ``replies`` is the list of turns in order, or a function of the turn's index and the token
    ids it continues. A text reply becomes its token ids followed by the tokenizer's eos
    token, each with log-prob ``log_prob`` and version ``weight_version``; a reply longer than
    the turn's ``max_tokens`` is cut there with finish reason ``length``. Every
    :meth:`generate` call is kept in ``calls`` as ``(token_ids, max_tokens)``.

    ``tools`` are built tools (``MyTool(config, part_context())``): :meth:`tool_schemas` offers
    them and :meth:`call_tools` runs them as a run does (the same error results, limits,
    timeouts, truncation and counts, under ``config``'s ``rollout.agent`` limits).
    ``parser`` reads tool calls out of a turn: a registered tool-call parser's name or the
    function itself (default: ``config.tool_parser``, ``hermes``); write scripted calls with
    :func:`tool_call_text`. ``environment`` is a function returning a fresh
    :class:`~plugrl.parts.agent.Environment` for :meth:`make_environment`. ``plugins`` is the
    plugin manager the parser is looked up in (default: the process's).

    What the run would add to the trajectory's metrics (``tool_calls``, ``tool_errors``,
    ``tool/<name>/calls``, ...) is :meth:`tool_metrics`; each tool result's ``metrics`` are
    kept in ``reported_metrics`` as ``(tool, key, value)``.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply] | Callable[[int, list[int]], Reply],
        *,
        tools: Sequence[Tool] = (),
        parser: str | ToolCallParser | None = None,
        environment: Callable[[], Environment] | None = None,
        config: AgentConfig | None = None,
        max_response_length: int = 256,
        sample_id: str = "uid-0/0",
        log_prob: float = -0.5,
        weight_version: int = 0,
        plugins: PluginManager | None = None,
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
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(
                    f"ScriptedSession tools must be built Tool objects, got "
                    f"{type(tool).__name__}; pass MyTool(config, part_context())"
                )
            name = tool.name or tool.schema()["function"]["name"]
            if name in self.tools:
                raise ValueError(f"two tools of this ScriptedSession are named {name!r}")
            self.tools[name] = tool
        self.parser = parser
        self.plugins = plugins
        self.reported_metrics: list[tuple[str, str, float]] = []
        self._caller: ToolCaller | None = None

    async def generate(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        image_inputs: Sequence[Mapping[str, Any]] = (),
    ) -> Completion:
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
        return [tool.schema() for tool in self.tools.values()]

    def parse_tool_calls(self, text: str) -> ParsedTurn:
        if not callable(self.parser):
            from plugrl.testing import part_context

            name = self.parser if self.parser is not None else self.config.tool_parser
            plugins = self.plugins if self.plugins is not None else part_context().plugins
            self.parser = plugins.registry("tool_parsers").get(name).load()
        return self.parser(text)

    async def call_tools(
        self, calls: Sequence[ToolCall], row: Mapping[str, Any]
    ) -> list[ToolResult]:
        caller = self._tool_caller()
        results = await caller.call_all(calls, row)
        self.last_tool_reward = caller.last_reward
        return results

    def tool_metrics(self) -> dict[str, float]:
        """What the tool calls so far add to the trajectory's metrics in a run."""
        return self._tool_caller().counters.metrics()

    async def release_tools(self) -> None:
        """Release the sample from every tool, as a run does when its trajectory ends."""
        for tool in self.tools.values():
            await tool.release(self.sample_id)

    def _tool_caller(self) -> ToolCaller:
        if self._caller is None:
            from plugrl.agents.session import ToolCaller

            self._caller = ToolCaller(
                self.tools,
                self.config,
                self.tokenizer,
                sample_id=self.sample_id,
                record_metric=lambda tool, key, value: self.reported_metrics.append(
                    (tool, key, float(value))
                ),
            )
        return self._caller

    def make_environment(self) -> Environment:
        if self.environment is None:
            raise ValueError(
                "this ScriptedSession has no environment; pass environment=<a function "
                "returning a fresh Environment>"
            )
        return self.environment()
