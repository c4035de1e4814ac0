"""The ``openai`` agent loop: a black-box agent written against the ``openai`` client, run once
per sample with its ``base_url`` on the run's OpenAI-compatible endpoint; every call it makes
is sampled by the run's engines and recorded token for token."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_agent_loops(register):
    register(
        "openai",
        "plugrl_openai_agent.loop:OpenAILoop",
        config="plugrl_openai_agent.loop:OpenAILoopConfig",
        requires=["openai", "uvicorn", "starlette"],
        install="pip install 'plugrl[agents]'",
        description="your agent function, calling the run's model through an OpenAI client",
    )
