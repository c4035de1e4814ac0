"""plugrl plugin: the ``regenerate`` scheduler. Only the name is registered here; the scheduler
is imported when a recipe chooses it (``scheduler: regenerate``)."""

from plugrl.api import hookimpl


@hookimpl
def register_schedulers(register):
    register(
        "regenerate",
        "plugrl_regenerate.scheduler:RegenerateScheduler",
        config="plugrl_regenerate.scheduler:RegenerateConfig",
        description="sync GRPO that samples again the groups whose scores are all equal",
    )
