"""The learning-health monitor as a plugin kind: a third party's check is registered, chosen,
given its options, and fired by the run loop into the step's metrics; a broken one stops the
run in one line naming it; runs built to trip the built-in checks trip them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest

import plugrl
from plugrl.api import option, positive
from plugrl.api.health import Finding, HealthCheck, HealthCheckConfig, metric_value
from plugrl.errors import HealthError, PluginError, RecipeError
from plugrl.testing import run_scheduler


@attrs.define(kw_only=True)
class SlowStepsConfig(HealthCheckConfig):
    max_step_s: float = option(1e9, "Fire when timing_s/step is above this.", validator=positive)


class SlowSteps(HealthCheck):
    """Fires while a step takes longer than ``max_step_s``."""

    config: SlowStepsConfig

    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        seconds = metric_value(metrics, "timing_s/step")
        if seconds is None or seconds <= self.config.max_step_s:
            return None
        return Finding("timing_s/step", seconds, "the step is slow", "use a faster machine")


class Raising(HealthCheck):
    def observe(self, step: int, metrics: Mapping[str, Any]) -> Finding | None:
        raise KeyError("actor/entropy")


class WrongReturn(HealthCheck):
    def observe(self, step: int, metrics: Mapping[str, Any]) -> Any:
        return "unhealthy"


@attrs.define(kw_only=True)
class NotACheckConfig:
    patience: int = 1


class ThirdParty:
    @plugrl.hookimpl
    def register_health_checks(self, register):
        register("slow_steps", SlowSteps, config=SlowStepsConfig)
        register("raising", Raising)
        register("wrong_return", WrongReturn)
        register("bad_config", SlowSteps, config=NotACheckConfig)


QUIET = {"trainer.logger": ["jsonl"]}


def test_a_third_party_check_fires_into_the_logged_metrics(
    tmp_path, plugrl_plugin_manager, plugrl_register_plugin, caplog
):
    plugrl_register_plugin(ThirdParty(), "third-party-health")
    run = run_scheduler(
        "sync",
        tmp_path,
        steps=4,
        overrides={
            **QUIET,
            "trainer.health": {
                "checks": ["slow_steps"],
                "check_args": {"slow_steps": {"max_step_s": 1e-9, "patience": 2}},
            },
        },
    )
    fired = {step: m for step, m in run.metrics.items() if "health/slow_steps" in m}
    assert list(fired) == [2]
    assert fired[2]["health/slow_steps"] == 1.0
    lines = [r.getMessage() for r in caplog.records if r.name == "plugrl.run.health"]
    assert len(lines) == 1
    assert lines[0].startswith("health check 'slow_steps': timing_s/step = ")
    assert lines[0].endswith("on steps 1-2: the step is slow; usual fix: use a faster machine")


def test_a_check_that_raises_stops_the_run_naming_it(
    tmp_path, plugrl_plugin_manager, plugrl_register_plugin
):
    plugrl_register_plugin(ThirdParty(), "third-party-health")
    with pytest.raises(
        PluginError,
        match=r"^health check 'raising' from plugin 'third-party-health' failed on step 1: "
        r"KeyError: 'actor/entropy'$",
    ):
        run_scheduler("sync", tmp_path, steps=2, overrides={"trainer.health.checks": ["raising"]})


def test_a_check_that_returns_something_else_is_named(
    tmp_path, plugrl_plugin_manager, plugrl_register_plugin
):
    plugrl_register_plugin(ThirdParty(), "third-party-health")
    with pytest.raises(PluginError, match=r"returned str from observe\(\); return a"):
        run_scheduler(
            "sync", tmp_path, steps=1, overrides={"trainer.health.checks": ["wrong_return"]}
        )


def test_a_config_class_must_extend_the_base(plugrl_register_plugin, plugrl_recipe):
    plugrl_register_plugin(ThirdParty(), "third-party-health")
    with pytest.raises(PluginError, match=r"does not extend plugrl.api.health.HealthCheckConfig"):
        plugrl_recipe({"trainer": {"health": {"checks": ["bad_config"]}}})


def test_without_the_built_in_checks_a_default_recipe_still_runs(
    tmp_path, plugrl_make_plugin_manager
):
    plugins = plugrl_make_plugin_manager({"PLUGRL_DISABLED_PLUGINS": "health_checks"})
    assert len(plugins.registry("health_checks")) == 0
    run = run_scheduler("sync", tmp_path, steps=1, overrides=QUIET, plugins=plugins)
    assert run.steps_run == 1
    with pytest.raises(RecipeError, match=r"unknown health check 'grad_norm'"):
        from plugrl.testing import make_recipe

        make_recipe({"trainer.health.checks": ["grad_norm"]}, plugins=plugins)


# ------------------------------------------------------------------ runs built to trip the checks


CONSTANT_REWARD = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5
"""


NEVER_STOPS = {"data.max_response_length": 2, "rollout.sim_long_fraction": 1.0}


def health_steps(run: Any) -> dict[str, list[int]]:
    fired: dict[str, list[int]] = {}
    for step, metrics in sorted(run.metrics.items()):
        for key in metrics:
            if key.startswith("health/"):
                fired.setdefault(key[len("health/") :], []).append(step)
    return fired


def test_a_short_response_budget_trips_response_clipping(tmp_path, plugrl_plugin_manager):
    # a model that never stops: every response runs to the budget
    run = run_scheduler("sync", tmp_path, steps=3, overrides={**QUIET, **NEVER_STOPS})
    assert all(run.metrics[step]["response_length/clip_ratio"] == 1.0 for step in (1, 2, 3))
    # the simulated policy has one parameter, a shift of every log-prob: with every response
    # of a group as long, its gradient is exactly zero, which grad_norm says too
    assert health_steps(run) == {"response_clipping": [2], "grad_norm": [2]}


def test_a_constant_reward_trips_constant_reward_zero_variance_and_grad_norm(
    tmp_path, plugrl_plugin_manager
):
    reward_file = tmp_path / "constant.py"
    reward_file.write_text(CONSTANT_REWARD)
    run = run_scheduler(
        "sync",
        tmp_path,
        steps=4,
        overrides={**QUIET, "reward.custom_function.path": str(reward_file)},
    )
    assert health_steps(run) == {
        "constant_reward": [3],
        "zero_variance": [3],
        "grad_norm": [2],
    }


def test_error_mode_stops_a_run_after_logging_the_step(tmp_path, plugrl_plugin_manager):
    with pytest.raises(HealthError, match=r"^health check 'response_clipping': .*mode=warn only"):
        run_scheduler(
            "sync",
            tmp_path,
            steps=5,
            overrides={
                **QUIET,
                **NEVER_STOPS,
                "trainer.health.mode": "error",
            },
        )
    from plugrl.api.loggers import read_metrics

    logged = read_metrics(tmp_path / "run")
    assert [row["step"] for row in logged][-1] == 2
    assert logged[-1]["health/response_clipping"] == 1.0


def test_a_run_stopped_by_a_check_resumes_with_mode_warn(tmp_path, plugrl_plugin_manager):
    stopping = {**QUIET, **NEVER_STOPS, "trainer.save_freq": 1}
    with pytest.raises(HealthError):
        run_scheduler(
            "sync", tmp_path, steps=4, overrides={**stopping, "trainer.health.mode": "error"}
        )
    # the health keys do not change the experiment: the same folder resumes from step 1
    run = run_scheduler(
        "sync",
        tmp_path,
        steps=4,
        overrides={**stopping, "trainer.resume_mode": "auto", "trainer.health.mode": "warn"},
    )
    assert [step for step, _ in run.logged] == [2, 3, 4]
    # the checks go on from the checkpoint of step 1 (clipping held there): it holds again on
    # step 2 and fires there, as in the run never stopped (see the response budget test)
    assert health_steps(run)["response_clipping"] == [2]


def test_an_update_far_from_the_sampling_policy_trips_kl_explosion(tmp_path, plugrl_plugin_manager):
    # four epochs of a large step: the later epochs train a policy far from the one sampled
    run = run_scheduler(
        "sync",
        tmp_path,
        steps=3,
        overrides={
            **QUIET,
            "actor.optim.lr": 10.0,
            "actor.ppo_epochs": 4,
            "actor.ppo_mini_batch_size": 2,
            "trainer.health.checks": ["kl_explosion"],
        },
    )
    assert abs(run.metrics[2]["actor/ppo_kl"]) > 0.5
    assert health_steps(run) == {"kl_explosion": [2]}


def test_the_sim_run_is_healthy_by_default(tmp_path, plugrl_plugin_manager):
    run = run_scheduler("sync", tmp_path, steps=4, overrides=QUIET)
    assert health_steps(run) == {}
