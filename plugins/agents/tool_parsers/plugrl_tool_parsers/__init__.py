"""Tool-call parsers for the chat formats of common model families: ``hermes`` (Qwen2.5,
Qwen3, Hermes: JSON inside ``<tool_call>`` tags) and ``llama3_json`` (Llama 3.1+: bare JSON
objects with ``name`` and ``parameters``)."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_tool_parsers(register):
    register(
        "hermes",
        "plugrl_tool_parsers.hermes:parse_hermes",
        description="<tool_call>{...}</tool_call> (Qwen2.5, Qwen3, Hermes)",
    )
