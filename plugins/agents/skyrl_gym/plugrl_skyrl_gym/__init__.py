"""The ``skyrl_gym`` environment: any environment registered with skyrl-gym (its built-in
``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``text2sql``, ... or one registered by the user's
code) played by the ``env`` agent loop."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_environments(register):
    register(
        "skyrl_gym",
        "plugrl_skyrl_gym.env:SkyrlGymEnvironment",
        config="plugrl_skyrl_gym.config:SkyrlGymConfig",
        requires=["skyrl_gym"],
        install="pip install skyrl-gym",
        description="a skyrl-gym environment (env_args.env_id, or the row's env_class column)",
    )
