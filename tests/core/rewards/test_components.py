"""Weighted reward components (``reward.components``): the recipe's one-line errors, the
weighted sum, metrics, extra columns, concurrency and failures, on test-local managers and on
two real built-in ones."""

from __future__ import annotations

import threading
from typing import ClassVar

import attrs
import pytest
import torch

import plugrl
from plugrl.compose.run_parts import build_reward_manager
from plugrl.config import option
from plugrl.errors import DataError, PluginError, RecipeError
from plugrl.parts.reward import RewardConfig, RewardManager, RewardOutput
from plugrl.parts.scoring import ScoringError
from plugrl.recipe import build_recipe
from plugrl.recipe.explaining import explain
from plugrl.recipe.reward_components import read_components
from plugrl.rewards.components import WeightedRewardComponents
from tests.plugins.rewards.rewards_testlib import STUB_SECTIONS, make_batch

ARITH = "plugrl/arithmetic"


# ------------------------------------------------------------------------------ fake managers


@attrs.define(kw_only=True)
class ConstantConfig(RewardConfig):
    """A test manager's section: each response scores ``value`` times its row number + 1."""

    value: float = option(1.0, "Score of the first response.")
    shape_first_token: float = option(0.0, "Added to each response's first token.")


class ConstantManager(RewardManager):
    """Scores row i ``value * (i + 1)`` on its last valid token and can shape the first."""

    calls: ClassVar[list[str]] = []
    inside = 0
    most_inside = 0
    lock = threading.Lock()
    barrier: threading.Barrier | None = None

    def __call__(self, batch):
        cls = type(self)
        with cls.lock:
            cls.inside += 1
            cls.most_inside = max(cls.most_inside, cls.inside)
            cls.calls.append(f"call {self.config.value}")
        try:
            if cls.barrier is not None:
                cls.barrier.wait()  # both components inside at once, or this breaks
            mask = batch["response_mask"]
            scores = torch.zeros(mask.shape, dtype=torch.float32)
            last = mask.sum(-1).long() - 1
            rows = torch.arange(mask.shape[0])
            scores[rows, last] = self.config.value * (rows.float() + 1)
            scores[:, 0] += self.config.shape_first_token
            extra = {
                "acc": [self.config.value > 1] * len(rows),
                "score": [0.5] * len(rows),
                f"only_{int(self.config.value)}": list(range(len(rows))),
            }
            metrics = {
                "reward/errors": 1.0,
                "reward/timeouts": 2.0,
                "reward/src/score": self.config.value,
                "perf/reward_workers": 1.0,
            }
            return RewardOutput(token_level_scores=scores, extra=extra, metrics=metrics)
        finally:
            with cls.lock:
                cls.inside -= 1

    def check_data_sources(self, data_sources):
        if "unknown" in data_sources:
            raise DataError("no reward function for data_source 'unknown'")

    def prefetch(self, batch):
        type(self).calls.append(f"prefetch {self.config.value} {len(batch)}")

    def close(self):
        type(self).calls.append(f"close {self.config.value}")


class BrokenManager(RewardManager):
    """Returns scores of the wrong shape."""

    def __call__(self, batch):
        return RewardOutput(token_level_scores=torch.zeros(1, 1))


class FakeManagers:
    @plugrl.hookimpl
    def register_reward_managers(self, register):
        register("constant", ConstantManager, config=ConstantConfig)
        register("broken", BrokenManager)


@pytest.fixture
def managers(plugins):
    """The rewards test plugins plus the fake managers; call records reset."""
    plugins.register(FakeManagers(), "fake-reward-managers")
    ConstantManager.calls = []
    ConstantManager.inside = ConstantManager.most_inside = 0
    ConstantManager.barrier = None
    return plugins


@pytest.fixture
def recipe_of(managers):
    def make(reward, max_response_length=16):
        raw = {**STUB_SECTIONS, "reward": reward}
        raw["data"] = {"max_response_length": max_response_length}
        return build_recipe(raw, managers)

    return make


@pytest.fixture
def build(recipe_of, managers, tokenizer):
    built = []

    def make(reward):
        manager = build_reward_manager(recipe_of(reward), tokenizer, managers)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def two_constants(**top):
    return {
        "manager": "constant",
        **top,
        "components": {
            "a": {"weight": 0.5, "value": 2.0, "shape_first_token": 0.25},
            "b": {"weight": -2.0, "value": 3.0},
        },
    }


def batch_of(tokenizer, texts=("ab", "abcd", "a"), data_source="src"):
    return make_batch(tokenizer, list(texts), data_source, ["x"] * len(texts), width=6)


# ------------------------------------------------------------------------------ the sum


def test_the_reward_is_the_weighted_sum_of_the_token_level_scores(build, tokenizer):
    manager = build(two_constants())
    assert isinstance(manager, WeightedRewardComponents)
    batch = batch_of(tokenizer)
    output = manager(batch)
    a, b = manager.components[0].manager(batch), manager.components[1].manager(batch)
    expected = 0.5 * a.token_level_scores.float() + -2.0 * b.token_level_scores.float()
    assert torch.equal(output.token_level_scores, expected)
    # the shaping stays on the first token, the score on the last valid one ("ab" + eos)
    assert output.token_level_scores[0].tolist() == [0.125, 0.0, 1.0 - 6.0, 0.0, 0.0, 0.0]


def test_metrics_per_component_and_of_the_sum(build, tokenizer):
    output = build(two_constants())(batch_of(tokenizer))
    metrics = output.metrics
    # a: rows score 2, 4, 6 plus 0.25 of shaping; b: 3, 6, 9
    assert metrics["reward/a/mean"] == pytest.approx(4.25)
    assert metrics["reward/a/std"] == pytest.approx(torch.tensor([2.0, 4, 6]).std(correction=0))
    assert metrics["reward/b/mean"] == pytest.approx(6.0)
    assert metrics["reward/a/latency_s"] >= 0 and metrics["reward/b/latency_s"] >= 0
    assert metrics["reward/a/src/score"] == 2.0 and metrics["reward/b/src/score"] == 3.0
    assert metrics["reward/a/perf/reward_workers"] == 1.0
    assert metrics["reward/a/errors"] == 1.0
    assert metrics["reward/errors"] == 2.0 and metrics["reward/timeouts"] == 4.0
    totals = output.token_level_scores.sum(-1)
    assert metrics["critic/score/mean"] == pytest.approx(float(totals.mean()))
    assert metrics["critic/score/max"] == pytest.approx(float(totals.max()))
    assert metrics["critic/score/min"] == pytest.approx(float(totals.min()))
    assert "reward/src/score" not in metrics


def test_extra_columns_prefixed_and_the_first_components_unprefixed(build, tokenizer):
    extra = build(two_constants())(batch_of(tokenizer)).extra
    assert extra["a_score"] == [2.25, 4.25, 6.25]
    assert extra["b_score"] == [3.0, 6.0, 9.0]
    assert extra["a/acc"] == [True] * 3 and extra["b/acc"] == [True] * 3
    assert extra["a/score"] == [0.5] * 3
    assert extra["acc"] == [True] * 3  # from a, the first in recipe order
    assert extra["only_2"] == [0, 1, 2] and extra["only_3"] == [0, 1, 2]
    assert "score" not in extra  # a component's raw score is not the run's


def test_prefetch_and_close_reach_every_component(build, tokenizer):
    manager = build(two_constants())
    manager.prefetch(batch_of(tokenizer, ("ab",)))
    manager.close()
    assert ConstantManager.calls == ["prefetch 2.0 1", "prefetch 3.0 1", "close 2.0", "close 3.0"]


def test_components_run_one_after_the_other_by_default(build, tokenizer):
    build(two_constants())(batch_of(tokenizer))
    assert ConstantManager.most_inside == 1


def test_components_concurrently_score_at_once(build, tokenizer):
    manager = build(two_constants(components_concurrently=True))
    # each component waits at the barrier until the other arrives: run one after the other
    # they would never meet, and the wait would break instead
    ConstantManager.barrier = threading.Barrier(2, timeout=60)
    output = manager(batch_of(tokenizer))
    assert ConstantManager.most_inside == 2
    assert output.metrics["reward/b/mean"] == pytest.approx(6.0)


@pytest.mark.parametrize("concurrently", [False, True])
def test_a_component_that_fails_the_output_check_is_named(build, tokenizer, concurrently):
    manager = build(
        {
            "components_concurrently": concurrently,
            "components": {
                "good": {"weight": 1.0, "manager": "constant"},
                "bad": {"weight": 1.0, "manager": "broken"},
            },
        }
    )
    with pytest.raises(PluginError) as caught:
        manager(batch_of(tokenizer))
    assert str(caught.value) == (
        "reward component 'bad': reward manager 'broken' (plugin 'fake-reward-managers') "
        "returned token_level_scores of shape (1, 1); expected (3, 6), one row per response "
        "and one column per response token"
    )


def test_check_data_sources_checks_each_component(build):
    manager = build(two_constants())
    with pytest.raises(DataError) as caught:
        manager.check_data_sources(["src", "unknown"])
    assert str(caught.value) == (
        "reward component 'a': no reward function for data_source 'unknown'"
    )


def test_without_components_the_manager_is_the_one_named(build):
    manager = build({"manager": "constant"})
    assert isinstance(manager, ConstantManager)


# ------------------------------------------------------------------------------ recipe


def test_components_inherit_the_top_level_keys_and_override_them(recipe_of, managers):
    recipe = recipe_of(
        {
            "manager": "constant",
            "timeout_s": 7.0,
            "value": 5.0,
            "components": {
                "a": {"weight": 1.0},
                "b": {"weight": 2.0, "manager": "naive", "timeout_s": 3.0},
            },
        }
    )
    a, b = recipe.reward.components["a"], recipe.reward.components["b"]
    assert a == {"weight": 1.0, "manager": "constant", "timeout_s": 7.0, "value": 5.0}
    # naive has no 'value': the top-level key does not reach it
    assert b == {"weight": 2.0, "manager": "naive", "timeout_s": 3.0}
    # a recorded recipe reads back the same components
    again = build_recipe({**STUB_SECTIONS, **recipe.to_dict()}, managers)
    assert read_components(again.reward, managers) == read_components(recipe.reward, managers)


@pytest.mark.parametrize(
    ("components", "message"),
    [
        (
            {"a": {"weight": 1.0, "valu": 2.0, "manager": "constant"}},
            "reward.components.a.valu: unknown key; did you mean 'reward.components.a.value'?",
        ),
        (
            {"a": {"manager": "constant"}},
            "reward.components.a.weight: missing; every component needs a weight (1.0 adds its "
            "score as it is)",
        ),
        (
            {"a": {}},
            "reward.components.a.weight: missing; every component needs a weight (1.0 adds its "
            "score as it is)",
        ),
        (
            {"a": {"weight": float("nan")}},
            "reward.components.a.weight: expected a finite number, got nan",
        ),
        (
            {"a": {"weight": "heavy"}},
            "reward.components.a.weight: expected a number, got 'heavy'",
        ),
        (
            {"a/b": {"weight": 1.0}},
            "reward.components.a/b: 'a/b' cannot name a component: its metrics are "
            "reward/NAME/*; use letters, digits, '_' and '-', starting with a letter",
        ),
        (
            {"errors": {"weight": 1.0}},
            "reward.components.errors: 'errors' cannot name a component: reward/errors counts "
            "the samples of all components; choose another name",
        ),
        (
            {"a": 1.0},
            "reward.components.a: expected a section of keys (weight, manager and the "
            "manager's reward keys), got 1.0",
        ),
        (
            {"a": {"weight": 1.0, "components": {"b": {"weight": 1.0}}}},
            "reward.components.a.components: a component cannot hold components; list every "
            "component under reward.components",
        ),
        (
            {"a": {"weight": 1.0, "timeout_s": -1}},
            "reward.components.a.timeout_s: must be > 0, got -1.0",
        ),
    ],
)
def test_recipe_errors_name_the_component_key(recipe_of, components, message):
    with pytest.raises(RecipeError) as caught:
        recipe_of({"components": components})
    assert str(caught.value) == message


def test_an_unknown_component_manager_lists_the_registered_ones(recipe_of, managers):
    with pytest.raises(RecipeError) as caught:
        recipe_of({"components": {"a": {"weight": 1.0, "manager": "nope"}}})
    registered = ", ".join(managers.registry("reward_managers").names())
    assert str(caught.value) == (
        f"reward.components.a.manager: unknown reward manager 'nope': registered: {registered}"
    )


def test_components_concurrently_without_components_is_an_error(recipe_of):
    with pytest.raises(RecipeError) as caught:
        recipe_of({"components_concurrently": True})
    assert str(caught.value) == (
        "reward.components_concurrently: has no effect without reward.components; set "
        "components or remove it"
    )


def test_explain_describes_the_components_and_their_keys(managers):
    info = explain("reward.components", managers)
    assert "weighted sum" in info.help
    weight = explain("reward.components.format.weight", managers)
    assert weight.type == "float" and "Factor" in weight.help
    timeout = explain("reward.components.format.timeout_s", managers)
    assert timeout.default == 30.0
    value = explain("reward.components.format.value", managers)
    assert "constant" in value.owner
    section = explain("reward.components.format", managers)
    assert section.is_section and section.children[:3] == ("weight", "manager", "custom_function")
    assert "value" in section.children and "components" not in section.children


# ------------------------------------------------------------------------------ real managers

FORMAT_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ok = solution_str.startswith("Answer:")
    return {"score": 1.0 if ok else 0.0, "formatted": ok}
"""

RAISING_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("no format")
"""


def test_two_built_in_components_arithmetic_and_a_custom_function(
    make_recipe, plugins, tokenizer, scorer_file
):
    path = scorer_file(FORMAT_FILE, "format.py")
    recipe = make_recipe(
        {
            "components": {
                "correct": {"weight": 1.0},
                "format": {"weight": 0.25, "custom_function": {"path": str(path)}},
            }
        }
    )
    manager = build_reward_manager(recipe, tokenizer, plugins)
    try:
        manager.check_data_sources([ARITH])
        texts = ["Answer: 4", "Answer: 5", "4"]
        batch = make_batch(tokenizer, texts, ARITH, ["4", "4", "4"], width=12)
        output = manager(batch)
    finally:
        manager.close()
    correct, formatted = [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]
    assert output.token_level_scores.sum(-1).tolist() == [
        c + 0.25 * f for c, f in zip(correct, formatted, strict=True)
    ]
    assert output.extra["correct_score"] == correct
    assert output.extra["format_score"] == formatted
    assert output.extra["acc"] == [True, False, False]  # the arithmetic scorer's
    assert output.extra["format/formatted"] == [True, True, False]
    assert output.metrics["reward/correct/mean"] == pytest.approx(1 / 3)
    assert output.metrics["reward/format/mean"] == pytest.approx(2 / 3)
    assert output.metrics[f"reward/correct/{ARITH}/score"] == pytest.approx(1 / 3)


def test_a_component_failing_under_raise_is_named(make_recipe, plugins, tokenizer, scorer_file):
    path = scorer_file(RAISING_FILE, "raising.py")
    recipe = make_recipe(
        {
            "components": {
                "correct": {"weight": 1.0},
                "format": {"weight": 0.25, "custom_function": {"path": str(path)}},
            }
        }
    )
    manager = build_reward_manager(recipe, tokenizer, plugins)
    try:
        with pytest.raises(ScoringError) as caught:
            manager(make_batch(tokenizer, ["Answer: 4"], ARITH, ["4"]))
    finally:
        manager.close()
    assert str(caught.value).startswith(
        "reward component 'format': reward function for data_source 'plugrl/arithmetic' "
        "failed on sample 0: ValueError: no format"
    )


def test_a_component_with_a_missing_file_names_its_key(make_recipe, plugins, tokenizer, tmp_path):
    missing = str(tmp_path / "missing.py")
    recipe = make_recipe(
        {"components": {"format": {"weight": 1.0, "custom_function": {"path": missing}}}}
    )
    with pytest.raises(RecipeError) as caught:
        build_reward_manager(recipe, tokenizer, plugins)
    assert str(caught.value) == (
        f"reward.components.format.custom_function.path: reward function file {missing!r} "
        "not found; set it to the Python file that defines your scoring function"
    )


def test_a_components_function_kwargs_without_a_path_is_an_error(recipe_of):
    with pytest.raises(RecipeError) as caught:
        recipe_of(
            {
                "components": {
                    "a": {"weight": 1.0},
                    "b": {"weight": 1.0, "custom_function": {"kwargs": {"strict": True}}},
                }
            }
        )
    assert str(caught.value) == (
        "reward.components.b.custom_function.kwargs: set without "
        "reward.components.b.custom_function.path, so no function receives them; set the path "
        "of the file that defines the function, or give a registered function its options with "
        "reward.function_args.<name>"
    )


def test_one_component_of_weight_one_scores_as_its_manager_alone(build, tokenizer):
    alone = build({"manager": "constant", "value": 2.0, "shape_first_token": 0.5})
    combined = build(
        {
            "manager": "constant",
            "value": 2.0,
            "shape_first_token": 0.5,
            "components": {"only": {"weight": 1.0}},
        }
    )
    batch = batch_of(tokenizer)
    expected, got = alone(batch), combined(batch)
    assert torch.equal(got.token_level_scores, expected.token_level_scores)
    assert got.extra["acc"] == expected.extra["acc"]
    for key in ("critic/score/mean", "critic/score/max", "critic/score/min"):
        assert got.metrics[key] == pytest.approx(
            float(getattr(expected.token_level_scores.sum(-1), key.rsplit("/", 1)[1])())
        )
