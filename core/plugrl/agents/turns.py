"""The tokens an agent loop appends between two model turns, rendered by the chat template.

Token in, token out: a loop keeps the tokens of each model turn exactly as the engine sampled
them, and appends after them, with ``loss_mask`` 0, only what the chat template writes
between that turn and the next: the close of the model's turn, the new messages (tool results,
an environment's observation, a user's reply) and the opening of the next model turn.
:func:`tokens_between_turns` renders that stretch alone, so earlier turns are never tokenized
again (a template may render a past turn differently from how it was sampled: Qwen3's drops
the thinking of earlier turns).

A custom loop's turn, end to end::

    from plugrl.agents.turns import tokens_between_turns

    completion = await session.generate([*out.prompt_ids, *out.response_ids], left)
    out.add_turn(completion)
    results = await session.call_tools(calls, row)
    answers = [{"role": "tool", "content": r.text, "tool_call_id": c.id, "name": c.name}
               for c, r in zip(calls, results)]
    between = tokens_between_turns(session.tokenizer, answers,
                                   last_token_ids=completion.token_ids,
                                   tools=session.tool_schemas() or None)
    out.add_appended(between[: session.max_response_length - len(out.response_ids)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plugrl.parts.agent import Message

TURN_MARKER = "PLUGRL-TURN-7f3a"
"""The content of the stand-in model turn the new messages are rendered after: what the
template writes after it is what it writes after any model turn."""

_OPENING: list[Message] = [{"role": "user", "content": "u"}]


def tokens_between_turns(
    tokenizer: Any,
    new_messages: Sequence[Message],
    *,
    last_token_ids: Sequence[int] = (),
    tools: Sequence[Mapping[str, Any]] | None = None,
    generation_prompt: bool = True,
    template_options: Mapping[str, Any] | None = None,
) -> list[int]:
    """The token ids to append after a model turn whose sampled tokens end with
    ``last_token_ids``, before the next model turn is generated.

    They are, as ``tokenizer``'s chat template renders them: the rest of the close of the
    model's turn (its end-of-turn token, e.g. ``<|im_end|>``, unless the model sampled it as
    the last of ``last_token_ids``, and what the template writes after it, e.g. ChatML's
    newline), ``new_messages`` (chat messages: ``{"role": "tool", "content": ...}``,
    ``{"role": "user", ...}``), and with ``generation_prompt`` the opening of the next model
    turn (``<|im_start|>assistant\\n``). ``tools`` are the schemas the prompt was rendered with
    (templates that place them by the messages need them); ``template_options`` are passed
    to ``apply_chat_template`` (``{"enable_thinking": False}``).

    Only the last of ``last_token_ids`` is read (pass the turn's ``completion.token_ids``).
    The caller gives the result ``loss_mask`` 0 (:meth:`Trajectory.add_appended
    <plugrl.parts.agent.Trajectory.add_appended>`) and cuts it to what is left of
    ``data.max_response_length``. Messages with images: render with
    :func:`text_between_turns` and encode with the session's images
    (:meth:`plugrl.agents.images.TurnImages.encode`).

    Raises ``ValueError`` when the template does not render an assistant message's content
    verbatim (then the close of a turn cannot be told apart from its content).
    """
    between = text_between_turns(
        tokenizer,
        new_messages,
        last_token_ids=last_token_ids,
        tools=tools,
        generation_prompt=generation_prompt,
        template_options=template_options,
    )
    return list(tokenizer.encode(between, add_special_tokens=False))


def text_between_turns(
    tokenizer: Any,
    new_messages: Sequence[Message],
    *,
    last_token_ids: Sequence[int] = (),
    tools: Sequence[Mapping[str, Any]] | None = None,
    generation_prompt: bool = True,
    template_options: Mapping[str, Any] | None = None,
) -> str:
    """The text :func:`tokens_between_turns` encodes: what the chat template writes after a
    model turn, before the next one."""
    text = tokenizer.apply_chat_template(
        [*_OPENING, {"role": "assistant", "content": TURN_MARKER}, *new_messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=generation_prompt,
        tokenize=False,
        **dict(template_options or {}),
    )
    if text.count(TURN_MARKER) != 1:
        raise ValueError(
            "the tokenizer's chat template does not render an assistant message's content as "
            "given, so what comes between two turns cannot be appended to sampled tokens; use a "
            "chat template that renders assistant turns verbatim"
        )
    between = text[text.index(TURN_MARKER) + len(TURN_MARKER) :]
    # the model may have sampled the close's first token (its end of turn) itself
    if last_token_ids and last_token_ids[-1] in tokenizer.all_special_ids:
        sampled_close = tokenizer.decode([last_token_ids[-1]], skip_special_tokens=False)
        if between.startswith(sampled_close):
            between = between[len(sampled_close) :]
    return between
