"""The ``verifiers`` environment: an environment written with the verifiers library
(``MultiTurnEnv``, ``SingleTurnEnv``, ...: its ``env_response``, stop conditions and rubric)
played by the ``env`` agent loop, the rubric's score as the episode's reward."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_environments(register):
    register(
        "verifiers",
        "plugrl_verifiers_env.env:VerifiersEnvironment",
        config="plugrl_verifiers_env.config:VerifiersConfig",
        requires=["verifiers"],
        install="pip install 'plugrl[verifiers]'",
        description="a verifiers environment (env_args.environment), scored by its rubric",
    )
