"""Numbers that cannot mean anything: ``nan`` and the infinities are refused wherever a recipe
gives options, with one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import attrs
import pytest

import plugrl
from plugrl.config import option
from plugrl.config.structuring import check_finite, structure
from plugrl.errors import RecipeError
from plugrl.parts.rollout import RolloutConfig
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import load_recipe
from tests.fake_parts import BASE_RECIPE


def error_of(path, *overrides: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides, get_plugin_manager())
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def base(write_recipe, fake_parts_manager):
    return write_recipe(BASE_RECIPE, "base.yaml")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor.optim.lr=nan", "actor.optim.lr: expected a finite number, got nan"),
        ("actor.optim.lr=NaN", "actor.optim.lr: expected a finite number, got nan"),
        ("actor.optim.lr=.nan", "actor.optim.lr: expected a finite number, got nan"),
        ("rollout.temperature=inf", "rollout.temperature: expected a finite number, got inf"),
        ("rollout.temperature=.inf", "rollout.temperature: expected a finite number, got inf"),
        ("actor.grad_clip=-Infinity", "actor.grad_clip: expected a finite number, got -inf"),
        ("actor.clip_ratio_low=nan", "actor.clip_ratio_low: expected a finite number, got nan"),
        ("actor.optim.betas=[0.9,nan]", "actor.optim.betas: expected a finite number, got nan"),
        (
            "reward.timeout_s=1e400",
            "reward.timeout_s: expected a finite number, got inf ('1e400' is beyond the "
            "largest float)",
        ),
        (
            "model.override_config.rope_scaling.factor=.inf",
            "model.override_config.rope_scaling.factor: expected a finite number, got inf",
        ),
        # validators compare: nan passed "must be > 0" and "between 0 and 1" before
        (
            "algorithm.rollout_is_threshold=nan",
            "algorithm.rollout_is_threshold: expected a finite number, got nan",
        ),
        ("rollout.top_p=nan", "rollout.top_p: expected a finite number, got nan"),
    ],
)
def test_core_keys_refuse_non_finite_numbers(base, override, message):
    assert error_of(base, override) == message


def test_an_integer_beyond_the_floats_is_refused_for_a_float_key(fake_parts_manager):
    with pytest.raises(RecipeError) as info:
        structure(RolloutConfig, {"temperature": 10**400}, "rollout")
    assert str(info.value) == (
        f"rollout.temperature: expected a finite number, got inf (1{'0' * 56}... is beyond "
        "the largest float)"
    )


def test_absurd_but_finite_numbers_still_read(base):
    recipe = load_recipe(
        base, ["actor.optim.lr=1e30", "rollout.temperature=1e-300"], get_plugin_manager()
    )
    assert recipe.actor.optim.lr == 1e30
    assert recipe.rollout.temperature == 1e-300


# ------------------------------------------------------------------ plugins' config classes


@attrs.define(kw_only=True)
class PlainFieldsConfig(RolloutConfig):
    """A plugin's config declared with plain attrs fields, not plugrl's ``option``."""

    ratio: float = 0.5
    bound: float | None = None
    weights: list[float] = attrs.field(factory=list)
    anything: Any = None
    table: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class RatioArgs:
    ratio: float = option(0.5, "A ratio.")


class PlainFieldsPlugin:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        register("plainengine", "tests.fake_parts:Part", config=PlainFieldsConfig)

    @plugrl.hookimpl
    def register_advantage_estimators(self, register):
        register("ratio_estimator", "tests.fake_parts:Part", config=RatioArgs)


@pytest.fixture
def plain(base, plugrl_register_plugin):
    plugrl_register_plugin(PlainFieldsPlugin(), "plain-fields")
    return base


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("rollout.ratio=nan", "rollout.ratio", "nan"),
        ("rollout.bound=-inf", "rollout.bound", "-inf"),
        ("rollout.weights=[1,.inf]", "rollout.weights", "inf"),
        ("rollout.anything=.nan", "rollout.anything", "nan"),
        ("rollout.anything=[1,[2,.inf]]", "rollout.anything", "inf"),
        ("rollout.table.deep.er=.nan", "rollout.table.deep.er", "nan"),
    ],
)
def test_a_plugins_plain_attrs_fields_refuse_non_finite_numbers(plain, override, key, value):
    message = error_of(plain, "rollout.engine=plainengine", override)
    assert message == f"{key}: expected a finite number, got {value}"


def test_a_parts_args_refuse_non_finite_numbers(plain):
    chosen = "algorithm.adv_estimator=ratio_estimator"
    assert error_of(plain, chosen, "algorithm.adv_estimator_args.ratio=inf") == (
        "algorithm.adv_estimator_args.ratio: expected a finite number, got inf"
    )


def test_a_string_nan_in_a_free_form_mapping_stays_a_string(plain):
    # only numbers are checked: a string is the function's to read
    recipe = load_recipe(
        plain, ["rollout.engine=plainengine", "rollout.table.word=nan"], get_plugin_manager()
    )
    assert recipe.rollout.table == {"word": "nan"}


def test_check_finite_names_the_first_offending_key():
    check_finite({"a": 1.0, "b": [1, 2.5], "c": {"d": "inf"}}, "section")
    with pytest.raises(RecipeError) as info:
        check_finite({"a": 1.0, "b": {"c": [0.0, float("-inf")]}}, "section")
    assert str(info.value) == "section.b.c: expected a finite number, got -inf"


# ------------------------------------------------------------------ the installed plugins


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["scheduler=fully_async", "scheduler.staleness_threshold=nan"],
            "scheduler.staleness_threshold: expected a finite number, got nan",
        ),
        (
            ["actor.backend=fsdp2", "actor.clip_ratio_c=inf"],
            "actor.clip_ratio_c: expected a finite number, got inf",
        ),
        (
            ["reward.function_args.openai/gsm8k.format_score=nan"],
            "reward.function_args.openai/gsm8k.format_score: expected a finite number, got nan",
        ),
        (
            ["reward.manager=dapo", "reward.overlong_buffer.penalty_factor=inf"],
            "reward.overlong_buffer.penalty_factor: expected a finite number, got inf",
        ),
        (
            ["actor.policy_loss=clip_cov", "actor.policy_loss_args.clip_cov_ratio=nan"],
            "actor.policy_loss_args.clip_cov_ratio: expected a finite number, got nan",
        ),
        (
            ["reward.custom_function.kwargs.bonus=.inf"],
            "reward.custom_function.kwargs.bonus: expected a finite number, got inf",
        ),
    ],
)
def test_the_installed_plugins_keys_refuse_non_finite_numbers(
    plugrl_plugin_manager, overrides, message
):
    with pytest.raises(RecipeError) as info:
        load_recipe(None, overrides, get_plugin_manager())
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.optim.lr=nan", "Error: actor.optim.lr: expected a finite number, got nan"),
        (
            "scheduler.staleness_threshold=nan",
            "Error: scheduler.staleness_threshold: expected a finite number, got nan",
        ),
        (
            "reward.function_args.openai/gsm8k.score=inf",
            "Error: reward.function_args.openai/gsm8k.score: expected a finite number, got inf",
        ),
    ],
)
def test_print_config_fails_on_one_line(override, expected):
    command = [sys.executable, "-m", "plugrl_tools.cli", "run", "quickstart-async"]
    result = subprocess.run(
        [*command, override, "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [expected]
