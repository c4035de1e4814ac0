"""Agents: how one sample's trajectory is produced, and the tools and environments it talks to.

Four kinds of part make multi-turn training:

* an **agent loop** (:class:`AgentLoop`) turns one dataset row into a :class:`Trajectory`,
  calling the engines turn by turn through a :class:`Session`; ``single_turn`` (one prompt,
  one response: what a run without agents does), ``tool`` and ``env`` are built in;
* a **tool** (:class:`Tool`) is a function the model may call: a name, an OpenAI function
  schema, and an async call;
* an **environment** (:class:`Environment`) drives the turns itself: it resets from a row and
  answers each of the model's messages with an observation, a reward and whether it is done;
* a **tool-call parser** (:class:`ToolCallParser`) reads the tool calls out of the text of
  one model turn, in the format the model's chat template teaches.

Token in, token out: a trajectory keeps the exact token ids the engine sampled; the tokens
appended between turns (tool results, observations, the chat template's turn markers) are
never sampled, so they get ``loss_mask`` 0, log-prob 0, and take no part in any loss, KL
penalty, entropy or advantage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs

from plugrl.config import option, positive

if TYPE_CHECKING:
    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import Completion

Message = dict[str, Any]
"""A chat message as ``apply_chat_template`` takes it: ``role``, ``content``, and for an
assistant turn that called tools, ``tool_calls``; for a tool's answer, ``tool_call_id`` and
``name``."""

AGENT_NAME_COLUMN = "agent_name"
"""The dataset column (verl's name) that picks a row's agent loop over ``rollout.agent.loop``."""

FINISH_REASONS = ("stop", "length", "max_turns", "aborted", "error")
"""How a trajectory ends: the model answered (``stop``), the total response length ran out
(``length``), ``rollout.agent.max_turns`` was reached, the engines aborted it (a weight
update in a run that does not continue samples), or the loop failed (``error``)."""


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class AgentConfig:
    """``rollout.agent``: which agent loop produces each sample, with which tools or
    environment, under which limits."""

    loop: str = option(
        "single_turn",
        "Agent loop of rows without an agent_name column value.",
        verl="actor_rollout_ref.rollout.agent.default_agent_loop",
        registry="agent_loops",
    )
    loop_args: dict[str, Any] = option(
        factory=dict, help="Options of the chosen agent loop (its config class checks them)."
    )
    tools: list[str] = option(
        factory=list, help="Tools the model may call (registered tool names).", registry="tools"
    )
    tool_args: dict[str, dict[str, Any]] = option(
        factory=dict, help="Options of each tool, by tool name (its config class checks them)."
    )
    tool_config_path: str | None = option(
        None,
        "A verl tool YAML file (tools: - class_name, config, tool_schema); each entry becomes "
        "a tool named by its schema, beside rollout.agent.tools (docs/agents.md).",
        verl="actor_rollout_ref.rollout.multi_turn.tool_config_path",
        path="input",
    )
    tool_parser: str = option(
        "hermes",
        "How tool calls are read from a model turn (hermes: Qwen2.5/Qwen3's <tool_call> "
        "JSON; llama3_json: Llama 3's JSON calls).",
        verl="actor_rollout_ref.rollout.multi_turn.format",
        registry="tool_parsers",
    )
    env: str | None = option(
        None, "Environment of the env agent loop (a registered name).", registry="environments"
    )
    env_args: dict[str, Any] = option(
        factory=dict, help="Options of the environment (its config class checks them)."
    )
    max_turns: int = option(
        5,
        "Assistant turns per trajectory at most; a trajectory that reaches it ends with "
        "finish_reason max_turns.",
        verl="actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
        validator=positive,
    )
    max_turn_tokens: int | None = option(
        None,
        "Tokens one model turn may sample at most; a turn cut there is read as a turn that "
        "ended (its tool calls run) and the trajectory goes on. Unset: what is left of "
        "data.max_response_length.",
        validator=positive,
    )
    max_tool_response_length: int = option(
        256,
        "Tokens of one tool result or observation at most; longer ones are truncated and marked.",
        verl="actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
        validator=positive,
    )
    max_parallel_calls: int = option(
        4,
        "Tool calls run from one model turn at most; further calls get an error result.",
        verl="actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
        validator=positive,
    )
    max_tools_in_flight: int = option(
        64, "Tool calls running at once in the whole run at most.", validator=positive
    )
    tool_timeout_s: float = option(
        30.0,
        "Seconds one tool call or environment step may take; then its worker is killed "
        "and the model sees a timeout error.",
        validator=positive,
    )


@attrs.define(kw_only=True)
class ToolConfig:
    """Base of a tool's own options (``rollout.agent.tool_args.<name>``)."""


@attrs.define(kw_only=True)
class EnvironmentConfig:
    """Base of an environment's own options (``rollout.agent.env_args``)."""


@attrs.define(kw_only=True)
class AgentLoopConfig:
    """Base of an agent loop's own options (``rollout.agent.loop_args``)."""


# --------------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model wrote. ``arguments`` is ``None`` and ``error`` says why when the
    call could not be read (bad JSON, no name): the model is told, nothing raises."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw: str
    """The text the call was read from."""
    error: str | None = None


@attrs.frozen(kw_only=True)
class ParsedTurn:
    """A model turn read by a :class:`ToolCallParser`: its text without the calls, and the
    calls in order."""

    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=tuple)


class ToolCallParser(Protocol):
    """A tool-call parser, what ``register_tool_parsers`` registers: a plain function from the
    decoded text of one model turn to its content and tool calls. It never raises on what a
    model wrote: a call it cannot read is a :class:`ToolCall` with ``error`` set."""

    def __call__(self, text: str) -> ParsedTurn:
        """The content and tool calls of ``text``."""
        ...


@attrs.define(kw_only=True)
class ToolResult:
    """The answer to one tool call: what :meth:`Tool.call` may return, and what
    :meth:`Session.call_tools` returns for each call.

    ``text`` is what the model reads as the tool's answer (from :meth:`Session.call_tools`:
    cut to ``rollout.agent.max_tool_response_length`` tokens and marked when longer, and for
    a failed call, the error message). ``reward`` (optional) is a reward at the end of the
    turn that called it. ``metrics`` are figures of this call, averaged into
    ``agent/tool/<name>/<key>``. ``error`` says the call failed: a tool may return
    ``error=True`` for a failure it explains in ``text`` instead of raising; the session sets
    it for a call it could not read, an unknown tool, refused arguments, an exception, a
    timeout or a call past ``rollout.agent.max_parallel_calls``. Failed calls are counted in
    ``tool_errors`` and ``agent/tool/<name>/errors``.

    ``images`` are images the model sees with the answer (a vision-language model's run: a
    "zoom into the image" tool returns its crop here): each a ``PIL.Image``, encoded image
    bytes (PNG, JPEG, ...), ``{"bytes": ...}`` or a path to an image file. ``text`` marks each
    one's place with ``<image>``; without any ``<image>`` the images come before the text."""

    text: str
    reward: float | None = None
    metrics: dict[str, float] = attrs.field(factory=dict)
    error: bool = False
    images: list[Any] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class ToolContext:
    """What a tool call knows of its sample: the dataset row (``reward_model.ground_truth``,
    ``extra_info``, ...) and the sample's id (``<uid>/<sample index>``), by which a tool with
    state per sample keeps it apart."""

    row: Mapping[str, Any]
    sample_id: str


class Tool(ABC):
    """A function the model may call. Built once per run as ``Tool(config, context)``:
    ``config`` is the tool's config class read from ``rollout.agent.tool_args.<name>``,
    ``context.recipe`` the run. Calls run concurrently on one event loop: a call that
    computes or blocks must run in a worker process (:func:`plugrl.agents.processes.run_in_process`)
    so that a timeout can kill it.
    """

    name: ClassVar[str] = ""
    """The name the model calls it by (the registered name when empty)."""

    def __init__(self, config: ToolConfig, context: PartContext) -> None:
        self.config = config
        self.context = context

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {"name": ...,
        "description": ..., "parameters": <JSON schema>}}``; it reaches the chat template as
        ``apply_chat_template(..., tools=[...])``."""

    @abstractmethod
    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult | str:
        """Run the call. Raise :class:`ToolArgumentError` for arguments that do not fit the
        schema; any exception becomes an error result the model sees (and a metric)."""

    async def release(self, sample_id: str) -> None:
        """Forget what was kept for ``sample_id`` (its trajectory ended)."""

    def close(self) -> None:
        """Release the tool's resources at the end of the run."""


class ToolArgumentError(ValueError):
    """Arguments a tool cannot take; its message is shown to the model."""


# --------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class StepResult:
    """An environment's answer to one model message: the observation the model sees next (a
    text, sent as a user message, or messages), the reward of this step, and whether the
    episode is over.

    ``images`` are images the observation shows (a vision-language model's run), as
    :attr:`ToolResult.images` takes them: the observation's text (the first message's content
    when it is messages) marks each one's place with ``<image>``; without any ``<image>`` the
    images come before the observation's first text."""

    observation: str | list[Message]
    reward: float = 0.0
    done: bool = False
    metrics: dict[str, float] = attrs.field(factory=dict)
    images: list[Any] = attrs.field(factory=list)


class Environment(ABC):
    """A gym-style environment, one instance per trajectory, built as
    ``Environment(config, context)`` (``config`` read from ``rollout.agent.env_args``).
    Its calls run under ``rollout.agent.tool_timeout_s``."""

    def __init__(self, config: EnvironmentConfig, context: PartContext) -> None:
        self.config = config
        self.context = context

    @abstractmethod
    async def reset(self, row: Mapping[str, Any]) -> list[Message] | None:
        """Start an episode from a dataset row; return the opening messages, or ``None`` to
        start from the row's own prompt."""

    @abstractmethod
    async def step(self, message: str) -> StepResult:
        """Answer the model's message (the decoded text of its turn)."""

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function schemas the environment offers the model (none by default)."""
        return []

    async def close(self) -> None:
        """End the episode and release what it holds."""


# --------------------------------------------------------------------------------------------
# Trajectories and agent loops
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class Trajectory:
    """One sample, produced by an agent loop.

    ``response_ids`` is everything after ``prompt_ids``: the sampled tokens of every model
    turn and the tokens appended between turns. ``loss_mask[i]`` is 1 when ``response_ids[i]``
    was sampled by the engine, whose ``log_probs[i]`` and ``token_versions[i]`` it keeps; 0
    (log-prob 0.0, the version of the turn before) for appended tokens. ``turn_ends`` are the
    indices in ``response_ids`` of each model turn's last token, where ``turn_rewards`` (same
    length, or empty) are given to estimators as token-level rewards. ``reward``, when set, is
    the episode's reward and stands for the reward manager's score.
    """

    prompt_ids: list[int]
    response_ids: list[int] = attrs.field(factory=list)
    loss_mask: list[int] = attrs.field(factory=list)
    log_probs: list[float] = attrs.field(factory=list)
    token_versions: list[int] = attrs.field(factory=list)
    finish_reason: str = "stop"
    weight_version: int = 0
    turn_ends: list[int] = attrs.field(factory=list)
    turn_rewards: list[float] = attrs.field(factory=list)
    reward: float | None = None
    num_turns: int = 0
    messages: list[Message] = attrs.field(factory=list)
    """The conversation, for the samples dump."""
    metrics: dict[str, float] = attrs.field(factory=dict)
    """Per-trajectory figures (``tool_calls``, ``tool_errors``, ...), averaged over the batch
    into ``agent/...`` metrics."""
    error: str = ""
    """With finish reason ``error``: why, in one line (an environment's exception, a
    timeout). A step whose trajectories all ended in error stops the run with the first."""
    image_inputs: list[dict[str, Any]] = attrs.field(factory=list)
    """A vision-language model's image inputs (the processor's ``pixel_values``,
    ``image_grid_thw``, ...) of every image in ``prompt_ids`` then ``response_ids``, in the
    order their tokens come: one mapping per stretch of tokens that brought images (the
    prompt's, then each tool result or observation with images). Empty for a text sample."""

    def add_turn(self, completion: Completion) -> None:
        """Append a model turn as the engine sampled it: its tokens with ``loss_mask`` 1,
        their log-probs and versions; the turn's last token becomes a turn end (an empty turn
        adds none); ``num_turns`` and ``weight_version`` follow."""
        tokens = list(completion.token_ids)
        self.response_ids.extend(tokens)
        self.loss_mask.extend([1] * len(tokens))
        self.log_probs.extend(completion.log_probs)
        self.token_versions.extend(completion.token_versions)
        self.weight_version = completion.weight_version
        self.num_turns += 1
        if tokens:
            self.turn_ends.append(len(self.response_ids) - 1)

    def add_appended(
        self, token_ids: Sequence[int], image_inputs: Mapping[str, Any] | None = None
    ) -> None:
        """Append tokens the model did not sample (tool results, observations, the chat
        template's turn markers: see :func:`plugrl.agents.turns.tokens_between_turns`) with
        ``loss_mask`` 0, log-prob 0.0 and the version of the token before them. Cut them to
        what is left of ``data.max_response_length`` first (never through an image's tokens).
        ``image_inputs`` are the image inputs of the images among them
        (:meth:`plugrl.agents.images.TurnImages.encode`)."""
        if image_inputs is not None:
            self.image_inputs.append(dict(image_inputs))
        version = self.token_versions[-1] if self.token_versions else self.weight_version
        self.response_ids.extend(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.log_probs.extend([0.0] * len(token_ids))
        self.token_versions.extend([version] * len(token_ids))

    def check(self) -> None:
        """Raise ``ValueError`` when the per-token lists differ in length or a turn end is
        out of range."""
        lengths = {
            len(self.response_ids),
            len(self.loss_mask),
            len(self.log_probs),
            len(self.token_versions),
        }
        if len(lengths) != 1:
            raise ValueError(
                f"a trajectory's response_ids, loss_mask, log_probs and token_versions differ "
                f"in length ({len(self.response_ids)}, {len(self.loss_mask)}, "
                f"{len(self.log_probs)}, {len(self.token_versions)})"
            )
        if any(not 0 <= end < len(self.response_ids) for end in self.turn_ends):
            raise ValueError("a trajectory's turn_ends point outside its response_ids")
        if self.turn_rewards and len(self.turn_rewards) != len(self.turn_ends):
            raise ValueError("a trajectory has turn_rewards but not one per turn end")


class Session(ABC):
    """One sample's access to the run, handed to :meth:`AgentLoop.run`: its engines (each
    turn sampled with a seed derived from the sample and the turn, so runs repeat), the
    tokenizer, the tools, the parser, and the limits of ``rollout.agent``."""

    sample_id: str
    tokenizer: Any
    config: AgentConfig
    max_response_length: int
    """``data.max_response_length``: the tokens of all turns together, appended ones too."""
    last_tool_reward: float | None = None
    """The sum of the rewards the tools of the last :meth:`call_tools` gave
    (``ToolResult.reward``), ``None`` when none gave one: the reward of the turn that called
    them."""
    images: Any = None
    """For a vision-language model's run, the :class:`plugrl.agents.images.TurnImages` that
    turns images into their tokens and image inputs; ``None`` for a text model."""

    @abstractmethod
    async def generate(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        image_inputs: Sequence[Mapping[str, Any]] = (),
    ) -> Completion:
        """One model turn continuing ``token_ids`` (the whole conversation so far), at most
        ``max_tokens`` new tokens, with the run's sampling. ``image_inputs`` are the image
        inputs of every image in ``token_ids``, in order (``Trajectory.image_inputs``)."""

    @abstractmethod
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The schemas of the run's tools (``rollout.agent.tools``)."""

    @abstractmethod
    def parse_tool_calls(self, text: str) -> ParsedTurn:
        """``text`` read by the run's tool-call parser."""

    @abstractmethod
    async def call_tools(
        self, calls: Sequence[ToolCall], row: Mapping[str, Any]
    ) -> list[ToolResult]:
        """Run ``calls`` (at most ``max_parallel_calls``, concurrently, each under
        ``tool_timeout_s``) and return one :class:`ToolResult` per call, in order: its
        ``text`` the model reads (an error message when ``error`` is set), its ``reward`` and
        ``metrics``. Never raises for what a call does; counts the calls, errors and
        latencies in the session's metrics."""

    @abstractmethod
    def make_environment(self) -> Environment:
        """A fresh instance of the run's environment (``rollout.agent.env``)."""


class AgentLoop(ABC):
    """Produces trajectories. Built once per run as ``AgentLoop(config, context)`` (``config``
    read from ``rollout.agent.loop_args``); :meth:`run` is called once per sample,
    concurrently on one event loop."""

    def __init__(self, config: AgentLoopConfig, context: PartContext) -> None:
        self.config = config
        self.context = context

    @abstractmethod
    async def run(self, row: Mapping[str, Any], session: Session) -> Trajectory | list[Trajectory]:
        """The trajectory of one sample of ``row`` (a dataset row: ``raw_prompt_ids``,
        ``prompt`` messages when the data has them, ``reward_model``, ``extra_info``...).

        A list is a sample made of several sequences that do not extend one another (a
        black-box agent whose calls do not continue each other token for token): each
        becomes a row of the batch with the sample's ``uid``, the last one carrying the
        episode's reward."""

    def close(self) -> None:
        """Release what the loop holds (a server, processes) at the end of the run."""
