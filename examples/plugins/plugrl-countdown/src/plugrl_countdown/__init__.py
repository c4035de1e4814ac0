"""plugrl plugin: the Countdown reward, registered for the data source ``countdown``."""

import plugrl


@plugrl.hookimpl
def register_reward_functions(register):
    register(
        "countdown",
        "plugrl_countdown.scoring:compute_score",
        description="Countdown: reach the target with each given number once",
    )
