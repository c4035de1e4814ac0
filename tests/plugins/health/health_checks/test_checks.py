"""The built-in learning-health checks: each trips on a metric sequence built to show its
problem, at its patience and not before, and stays silent on healthy runs (the quickstart's
real metrics, sync and fully_async)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from plugrl.errors import HealthError, RecipeError
from plugrl.run.health import HealthMonitor
from plugrl.testing import make_recipe

FIXTURES = Path(__file__).parent / "fixtures"
BUILT_IN = [
    "response_clipping",
    "zero_variance",
    "grad_norm",
    "entropy_collapse",
    "constant_reward",
    "kl_explosion",
]

# one step of a run that learns (the sync quickstart's first step, the metrics the checks read)
HEALTHY: dict[str, float] = {
    "critic/score/mean": 0.23,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "critic/advantages/max": 2.47,
    "critic/advantages/min": -1.62,
    "actor/ppo_kl": 0.0,
    "actor/entropy": 0.164,
    "actor/grad_norm": 0.413,
    "response_length/max": 43.0,
    "response_length/min": 1.0,
    "response_length/clip_ratio": 0.0,
}


def monitor(mode: str = "warn", **health: Any) -> HealthMonitor:
    recipe = make_recipe({"trainer": {"health": {"mode": mode, **health}}})
    return HealthMonitor.from_recipe(recipe, _plugins())


def _plugins() -> Any:
    from plugrl.plugin.manager import get_plugin_manager

    return get_plugin_manager()


def replay(health: HealthMonitor, steps: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Feed ``steps`` (1, 2, ...) to ``health``; the checks that fired, by step."""
    fired = {}
    for step, metrics in enumerate(steps, start=1):
        metrics = dict(metrics)
        alarms = health.observe(step, metrics)
        names = sorted(alarm.check for alarm in alarms)
        assert sorted(k[len("health/") :] for k in metrics if k.startswith("health/")) == names
        if names:
            fired[step] = names
    return fired


def healthy(**changes: float) -> dict[str, float]:
    return {**HEALTHY, **changes}


def read_fixture(name: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]
    return [row for row in rows if row["step"] > 0]  # step 0 is validation before training


# ------------------------------------------------------------------------- silent when healthy


@pytest.mark.parametrize(
    "fixture",
    [
        "quickstart_sync_5_steps.jsonl",
        "quickstart_async_5_steps.jsonl",
        "quickstart_sync_20_steps.jsonl",
        "quickstart_async_20_steps.jsonl",
    ],
)
def test_no_check_fires_on_the_quickstart_even_at_patience_one(fixture):
    steps = read_fixture(fixture)
    assert len(steps) in (5, 20)
    assert replay(monitor(), steps) == {}
    impatient = {name: {"patience": 1} for name in BUILT_IN}
    assert replay(monitor(check_args=impatient), steps) == {}


def test_the_20_step_fully_async_quickstart_stays_far_from_the_kl_bound():
    rows = read_fixture("quickstart_async_20_steps.jsonl")
    assert max(row["fully_async/monitor/max_version_lag"] for row in rows) >= 1  # off-policy
    (watched,) = monitor(checks=["kl_explosion"]).checks
    assert max(abs(row["actor/ppo_kl"]) for row in rows) < watched.check.config.max_ppo_kl / 10


def test_the_20_step_quickstart_learns_and_its_entropy_falls_without_a_warning():
    # the fixture keeps the keys the checks read from a whole `plugrl quickstart` run
    rows = [json.loads(line) for line in (FIXTURES / "quickstart_sync_20_steps.jsonl").open()]
    accuracy = [row["val-core/plugrl/arithmetic/acc/mean@1"] for row in (rows[0], rows[-1])]
    assert accuracy[1] > accuracy[0] + 0.2
    entropy = [row["actor/entropy"] for row in rows[1:]]
    assert min(entropy[-10:]) < min(entropy[:3])  # it falls as the model learns
    health = monitor(check_args={"entropy_collapse": {"patience": 1}})
    assert replay(health, rows[1:]) == {}
    (watched,) = [w for w in health.checks if w.name == "entropy_collapse"]
    # the fall is a fraction of what would fire: 1/20 of the first steps' mean
    assert min(entropy) > 5 * watched.check.baseline / watched.check.config.max_fall


def test_every_built_in_check_runs_by_default():
    assert [watched.name for watched in monitor().checks] == BUILT_IN
    assert monitor(mode="off").checks == []


def test_a_healthy_step_trips_nothing_over_many_steps():
    assert replay(monitor(), [healthy() for _ in range(30)]) == {}


# ------------------------------------------------------------------------- each check trips


TRIPS = {
    "response_clipping": (healthy(**{"response_length/clip_ratio": 1.0}), 2),
    "grad_norm": (healthy(**{"actor/grad_norm": 0.0}), 2),
    "kl_explosion": (healthy(**{"actor/ppo_kl": 3.0}), 2),
}


@pytest.mark.parametrize("check", sorted(TRIPS))
def test_a_check_fires_once_at_its_patience(check, caplog):
    step, patience = TRIPS[check]
    fired = replay(monitor(checks=[check]), [healthy(), *[step] * (patience + 3)])
    assert fired == {1 + patience: [check]}
    lines = [r.getMessage() for r in caplog.records if r.name == "plugrl.run.health"]
    assert len(lines) == 1 and lines[0].startswith(f"health check {check!r}: ")
    assert f"on steps 2-{1 + patience}" in lines[0] and "usual fix: " in lines[0]


def test_response_clipping_names_the_metric_and_the_fix(caplog):
    replay(
        monitor(checks=["response_clipping"]), [healthy(**{"response_length/clip_ratio": 1})] * 2
    )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "plugrl.run.health"]
    assert "response_length/clip_ratio = 1 on steps 1-2" in line
    assert "every response reached data.max_response_length" in line
    assert "raise data.max_response_length" in line


def test_response_clipping_stays_quiet_while_some_responses_end():
    assert (
        replay(
            monitor(checks=["response_clipping"]),
            [healthy(**{"response_length/clip_ratio": 0.97})] * 5,
        )
        == {}
    )


def test_a_lower_clip_threshold_is_an_option():
    health = monitor(
        checks=["response_clipping"], check_args={"response_clipping": {"min_clip_ratio": 0.5}}
    )
    assert replay(health, [healthy(**{"response_length/clip_ratio": 0.6})] * 2) == {
        2: ["response_clipping"]
    }


def test_zero_variance_fires_when_every_advantage_is_zero():
    flat = healthy(**{"critic/advantages/max": 0.0, "critic/advantages/min": 0.0})
    assert replay(monitor(checks=["zero_variance"]), [flat] * 5) == {3: ["zero_variance"]}
    # one group with a spread is a learning signal
    some = healthy(**{"critic/advantages/max": 0.7, "critic/advantages/min": -0.7})
    assert replay(monitor(checks=["zero_variance"]), [flat, flat, some, flat, flat]) == {}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_grad_norm_fires_on_a_non_finite_norm(value, caplog):
    assert replay(monitor(checks=["grad_norm"]), [healthy(**{"actor/grad_norm": value})] * 2) == {
        2: ["grad_norm"]
    }
    assert "not finite" in caplog.text and "lower actor.optim.lr" in caplog.text


def test_grad_norm_tolerates_one_skipped_step():
    steps = [healthy(), healthy(**{"actor/grad_norm": math.nan}), healthy()] * 3
    assert replay(monitor(checks=["grad_norm"]), steps) == {}


def test_entropy_collapse_fires_on_a_fall_from_the_first_values(caplog):
    start = [healthy(**{"actor/entropy": 0.2}) for _ in range(3)]
    learning = [healthy(**{"actor/entropy": 0.2 - 0.004 * i}) for i in range(30)]  # to 0.084
    assert replay(monitor(checks=["entropy_collapse"]), start + learning) == {}
    collapsed = [healthy(**{"actor/entropy": 0.005}) for _ in range(6)]
    assert replay(monitor(checks=["entropy_collapse"]), start + collapsed) == {
        8: ["entropy_collapse"]
    }
    assert "actor/entropy = 0.005 on steps 4-8" in caplog.text
    assert "1/40 of its first steps' 0.2" in caplog.text


def test_entropy_collapse_fires_below_the_floor_from_the_start():
    tiny = [healthy(**{"actor/entropy": 1e-4}) for _ in range(5)]
    assert replay(monitor(checks=["entropy_collapse"]), tiny) == {5: ["entropy_collapse"]}


def test_constant_reward_fires_when_every_score_is_one_value_and_responses_differ(caplog):
    constant = healthy(
        **{"critic/score/max": 0.5, "critic/score/min": 0.5, "critic/score/mean": 0.5}
    )
    assert replay(monitor(checks=["constant_reward"]), [constant] * 3) == {3: ["constant_reward"]}
    assert "critic/score/max = 0.5 on steps 1-3" in caplog.text
    same_length = {**constant, "response_length/max": 9.0, "response_length/min": 9.0}
    assert replay(monitor(checks=["constant_reward"]), [same_length] * 5) == {}


@pytest.mark.parametrize(
    ("changes", "metric"),
    [
        ({"actor/ppo_kl": -2.0}, "actor/ppo_kl"),
        ({"actor/kl_loss": 5.0}, "actor/kl_loss"),
        ({"actor/kl_loss": math.nan}, "actor/kl_loss"),
        (
            {
                "rollout_corr/rollout_is_ratio_fraction_high": 0.3,
                "rollout_corr/rollout_is_ratio_fraction_low": 0.1,
            },
            "rollout_corr/rollout_is_ratio_fraction_high+low",
        ),
    ],
)
def test_kl_explosion_watches_the_kls_and_the_importance_weights(changes, metric, caplog):
    assert replay(monitor(checks=["kl_explosion"]), [healthy(**changes)] * 2) == {
        2: ["kl_explosion"]
    }
    assert f"{metric} = " in caplog.text


def test_kl_explosion_is_quiet_on_ordinary_kls():
    ordinary = healthy(
        **{
            "actor/ppo_kl": 0.01,
            "actor/kl_loss": 0.05,
            "rollout_corr/rollout_is_ratio_fraction_high": 0.02,
            "rollout_corr/rollout_is_ratio_fraction_low": 0.01,
        }
    )
    assert replay(monitor(checks=["kl_explosion"]), [ordinary] * 10) == {}


# ------------------------------------------------------------------------- patience, re-arm, mode


def test_a_check_re_arms_once_its_condition_clears():
    clipped = healthy(**{"response_length/clip_ratio": 1.0})
    steps = [clipped] * 4 + [healthy()] + [clipped] * 3
    assert replay(monitor(checks=["response_clipping"]), steps) == {
        2: ["response_clipping"],
        7: ["response_clipping"],
    }


def test_a_missing_metric_clears_the_condition():
    clipped = healthy(**{"response_length/clip_ratio": 1.0})
    gap = {k: v for k, v in HEALTHY.items() if k != "response_length/clip_ratio"}
    assert replay(monitor(checks=["response_clipping"]), [clipped, gap, clipped, gap]) == {}


def test_patience_is_an_option_of_each_check():
    clipped = healthy(**{"response_length/clip_ratio": 1.0})
    health = monitor(
        checks=["response_clipping"], check_args={"response_clipping": {"patience": 4}}
    )
    assert replay(health, [clipped] * 6) == {4: ["response_clipping"]}


def test_error_mode_stops_with_the_first_line_and_logs_the_others(caplog):
    health = monitor(mode="error", checks=["response_clipping", "grad_norm"])
    both = healthy(**{"actor/grad_norm": 0.0, "response_length/clip_ratio": 1.0})
    health.observe(1, dict(both))
    alarms = health.observe(2, dict(both))
    assert [alarm.check for alarm in alarms] == ["response_clipping", "grad_norm"]
    assert caplog.records == []
    with pytest.raises(HealthError, match=r"^health check 'response_clipping': "):
        health.raise_if_stopping(alarms)
    (logged,) = [r.getMessage() for r in caplog.records if r.name == "plugrl.run.health"]
    assert logged.startswith("health check 'grad_norm': ")


def test_error_mode_stops_with_the_line():
    health = monitor(mode="error", checks=["grad_norm"])
    metrics = healthy(**{"actor/grad_norm": 0.0})
    assert health.observe(1, dict(metrics)) == []
    health.raise_if_stopping([])
    alarms = health.observe(2, dict(metrics))
    with pytest.raises(
        HealthError,
        match=r"^health check 'grad_norm': actor/grad_norm = 0 on steps 1-2: .*"
        r"trainer.health.mode=warn only warns\)$",
    ):
        health.raise_if_stopping(alarms)


def test_warn_mode_does_not_stop():
    health = monitor(checks=["grad_norm"])
    metrics = healthy(**{"actor/grad_norm": 0.0})
    health.observe(1, dict(metrics))
    health.raise_if_stopping(health.observe(2, dict(metrics)))


@pytest.mark.parametrize(
    ("health", "match"),
    [
        ({"mode": "loud"}, r"trainer.health.mode: must be one of warn, error, off"),
        ({"checks": ["entropy_colapse"]}, r"did you mean 'entropy_collapse'"),
        (
            {"check_args": {"entropy_collapse": {"min_entropy": -1}}},
            r"trainer.health.check_args.entropy_collapse.min_entropy",
        ),
        (
            {"check_args": {"entropy_collapse": {"patience": 0}}},
            r"trainer.health.check_args.entropy_collapse.patience: must be > 0",
        ),
        (
            {"check_args": {"grad_norm": {"treshold": 1}}},
            r"trainer.health.check_args.grad_norm",
        ),
        (
            {"checks": ["grad_norm"], "check_args": {"kl_explosion": {"patience": 2}}},
            r"trainer.health.check_args.kl_explosion: options for health check 'kl_explosion', "
            r"which trainer.health.checks does not list",
        ),
    ],
)
def test_bad_health_keys_are_one_line_recipe_errors(health, match):
    with pytest.raises(RecipeError, match=match):
        make_recipe({"trainer": {"health": health}})


def test_a_resumed_monitor_fires_on_the_steps_the_uninterrupted_one_does():
    """The checks' counts and the entropy baseline go into a checkpoint and come back: a run
    resumed after step 5 fires where the run never stopped fires, not patience steps later
    and not against a baseline of its collapsed steps."""
    import io

    import torch

    start = [healthy(**{"actor/entropy": 0.2}) for _ in range(3)]
    collapsed = [healthy(**{"actor/entropy": 0.005}) for _ in range(6)]
    steps = start + collapsed
    checks = ["entropy_collapse"]
    whole = replay(monitor(checks=checks), steps)
    assert whole == {8: ["entropy_collapse"]}

    before = monitor(checks=checks)
    replay(before, steps[:5])
    saved = io.BytesIO()
    torch.save(before.state_dict(), saved)  # as a checkpoint holds it: plain data
    saved.seek(0)
    resumed = monitor(checks=checks)
    resumed.load_state_dict(torch.load(saved, weights_only=True))
    fired = {}
    for step, metrics in enumerate(steps[5:], start=6):
        alarms = resumed.observe(step, dict(metrics))
        if alarms:
            fired[step] = [alarm.check for alarm in alarms]
    assert fired == whole
