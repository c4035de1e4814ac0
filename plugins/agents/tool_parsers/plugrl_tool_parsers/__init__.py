"""Tool-call parsers for the chat formats of common model families: ``hermes`` (Qwen2.5,
Qwen3, Hermes: JSON inside ``<tool_call>`` tags), ``llama3_json`` (Llama 3.1+: bare JSON
objects with ``name`` and ``parameters``) and ``gpt-oss`` (OpenAI's harmony messages)."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_tool_parsers(register):
    register(
        "hermes",
        "plugrl_tool_parsers.hermes:parse_hermes",
        description="<tool_call>{...}</tool_call> (Qwen2.5, Qwen3, Hermes)",
    )
    register(
        "llama3_json",
        "plugrl_tool_parsers.llama3_json:parse_llama3_json",
        description='{"name": ..., "parameters": {...}}, ;-separated (Llama 3.1, 3.2)',
    )
    register(
        "gpt-oss",
        "plugrl_tool_parsers.gpt_oss:parse_gpt_oss",
        description="harmony: <|channel|>commentary to=functions.NAME ...<|call|> (gpt-oss)",
        aliases=["harmony"],
    )
