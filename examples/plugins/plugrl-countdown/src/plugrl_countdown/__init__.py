"""plugrl plugin: the Countdown reward, registered for the data source ``countdown``.

Only names are registered here: the scorer and its options class are imported when a recipe
needs them.
"""

from plugrl.api import hookimpl


@hookimpl
def register_reward_functions(register):
    register(
        "countdown",
        "plugrl_countdown.scoring:compute_score",
        config="plugrl_countdown.options:CountdownOptions",
        description="Countdown: reach the target with each given number once",
    )
