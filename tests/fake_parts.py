"""An in-process plugin registering one name for every kind a recipe checks, so recipe and run
tests do not depend on which real parts are installed. Its names are prefixed ``fake``."""

from __future__ import annotations

import attrs

import plugrl
from plugrl.config import option
from plugrl.parts.rollout import RolloutConfig
from plugrl.parts.scheduler import Scheduler, SchedulerConfig


class Part:
    """Stands for a class that a recipe only names."""


@attrs.define(kw_only=True)
class FakeEngineConfig(RolloutConfig):
    engine_option: int = option(7, "An option only this engine has.")


@attrs.define(kw_only=True)
class StepOptions:
    steps: int = option(2, "Steps to run.")


@attrs.define(kw_only=True)
class FakeSchedulerConfig(SchedulerConfig):
    steps: int = option(2, "Steps to run.")


class CountingScheduler(Scheduler):
    """Trains nothing: ``steps`` steps, step N reporting ``critic/score/mean`` N / 10, through
    the core's run loop (with the simulated parts of ``plugrl_sim``, see tests/core/test_run.py)."""

    def total_steps(self, parts):
        return self.config.steps

    def train_step(self, parts, step):
        return {"critic/score/mean": step / 10, "timing_s/step": 0.0}


class NotAConfig:
    pass


@plugrl.hookimpl
def register_training_backends(register):
    register("fakebackend", Part)


@plugrl.hookimpl
def register_rollout_engines(register):
    register("fakeengine", Part, config=FakeEngineConfig)
    register("badconfig", Part, config=NotAConfig)


@plugrl.hookimpl
def register_reward_managers(register):
    register("fakemanager", Part)


@plugrl.hookimpl
def register_schedulers(register):
    register("fakescheduler", CountingScheduler, config=FakeSchedulerConfig)


@plugrl.hookimpl
def register_advantage_estimators(register):
    register("fakeestimator", Part)
    register("fakeestimator_with_args", Part, config=StepOptions)


@plugrl.hookimpl
def register_policy_losses(register):
    register("fakeloss", Part)


@plugrl.hookimpl
def register_kl_penalties(register):
    register("fakekl", Part)


@plugrl.hookimpl
def register_agent_loops(register):
    register("fakeloop", Part)


@plugrl.hookimpl
def register_tool_parsers(register):
    register("fakeparser", Part)


BASE_RECIPE = {
    "device": "cpu",
    "actor": {"backend": "fakebackend", "policy_loss": "fakeloss", "kl_loss_type": "fakekl"},
    "rollout": {"engine": "fakeengine", "agent": {"loop": "fakeloop", "tool_parser": "fakeparser"}},
    "algorithm": {"adv_estimator": "fakeestimator", "kl_penalty": "fakekl"},
    "reward": {"manager": "fakemanager"},
    "scheduler": {"name": "fakescheduler"},
}
