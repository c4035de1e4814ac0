"""Names for the parts a recipe needs besides the reward, so reward tests can build full
recipes without depending on which backends, engines and schedulers are installed."""

import plugrl


class Part:
    """Stands for a class that a recipe only names."""


@plugrl.hookimpl
def register_training_backends(register):
    register("rewards_test_backend", Part)


@plugrl.hookimpl
def register_rollout_engines(register):
    register("rewards_test_engine", Part)


@plugrl.hookimpl
def register_schedulers(register):
    register("rewards_test_scheduler", Part)


@plugrl.hookimpl
def register_advantage_estimators(register):
    register("rewards_test_estimator", Part)


@plugrl.hookimpl
def register_policy_losses(register):
    register("rewards_test_loss", Part)


@plugrl.hookimpl
def register_kl_penalties(register):
    register("rewards_test_kl", Part)
