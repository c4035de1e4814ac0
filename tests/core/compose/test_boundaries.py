"""What a reward manager or an estimator hands back is checked where the core receives it, and
a wrong shape names the part and its plugin in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import plugrl
from plugrl.data.dataset import PromptRecord
from plugrl.errors import PluginError
from plugrl.parts.algorithm import AdvantageEstimator
from plugrl.parts.reward import RewardManager, RewardOutput
from plugrl.parts.rollout import Completion
from plugrl.plugin.boundaries import check_estimator_output, check_reward_output
from plugrl.plugin.build import build_estimator, build_part
from plugrl.plugin.manager import get_plugin_manager
from plugrl.run.metrics import StepTimer
from plugrl.run.steps import update_from_batch, validate
from plugrl.testing import make_batch, part_context

B, R = 4, 5  # make_batch((3, 5), 5, n=2): two prompts, two responses each


def last_token_scores(batch, values):
    scores = torch.zeros(batch["response_mask"].shape)
    last = batch["response_mask"].sum(dim=-1) - 1
    scores[torch.arange(len(batch)), last] = torch.tensor(values, dtype=torch.float32)
    return scores


class PerResponseScores(RewardManager):
    """Returns one score per response: what verl's reward function gives, not a manager."""

    def __call__(self, batch):
        return RewardOutput(token_level_scores=torch.ones(len(batch)))


class IntegerScores(RewardManager):
    def __call__(self, batch):
        return RewardOutput(
            token_level_scores=torch.zeros(batch["response_mask"].shape, dtype=torch.long)
        )


class NanScores(RewardManager):
    def __call__(self, batch):
        return RewardOutput(
            token_level_scores=last_token_scores(batch, [1.0, float("nan"), 0.0, float("inf")])
        )


class ShortExtra(RewardManager):
    def __call__(self, batch):
        scores = last_token_scores(batch, [1.0] * len(batch))
        return RewardOutput(token_level_scores=scores, extra={"acc": [True, False]})


class ScalarExtra(RewardManager):
    def __call__(self, batch):
        scores = last_token_scores(batch, [1.0] * len(batch))
        return RewardOutput(token_level_scores=scores, extra={"acc": 0.5})


class PlainDict(RewardManager):
    def __call__(self, batch):
        return {"token_level_scores": last_token_scores(batch, [1.0] * len(batch))}


class Scores(RewardManager):
    """A manager that does it right: one score per response, on its last token."""

    def __call__(self, batch):
        values = [float(i % 2) for i in range(len(batch))]
        return RewardOutput(
            token_level_scores=last_token_scores(batch, values), extra={"acc": values}
        )


class PerResponseAdvantages(AdvantageEstimator):
    def compute(self, batch):
        scores = batch["token_level_rewards"].sum(dim=-1)
        return scores - scores.mean(), scores


class OnlyAdvantages(AdvantageEstimator):
    def compute(self, batch):
        return torch.zeros(batch["response_mask"].shape)


class NanOnResponses(AdvantageEstimator):
    def compute(self, batch):
        advantages = torch.full(batch["response_mask"].shape, float("nan"))
        return advantages, advantages


class NanOffResponses(AdvantageEstimator):
    """NaN only on padding, which every loss masks: accepted."""

    def compute(self, batch):
        mask = batch["response_mask"].bool()
        advantages = torch.where(mask, 1.0, float("nan"))
        return advantages, advantages


class ThirdParty:
    @plugrl.hookimpl
    def register_reward_managers(self, register):
        for cls in (PerResponseScores, IntegerScores, NanScores, ShortExtra, ScalarExtra):
            register(cls.__name__.lower(), cls)
        register("plaindict", PlainDict)
        register("scores", Scores)

    @plugrl.hookimpl
    def register_advantage_estimators(self, register):
        for cls in (PerResponseAdvantages, OnlyAdvantages, NanOnResponses, NanOffResponses):
            register(cls.__name__.lower(), cls)


@pytest.fixture
def plugins(plugrl_register_plugin, plugrl_plugin_manager):
    plugrl_register_plugin(ThirdParty(), "third-party")
    return plugrl_plugin_manager


@pytest.fixture
def batch():
    return make_batch((3, 5), 5, n=2, scores=[1.0, 0.0, 1.0, 1.0])


def scored(name, batch, plugrl_recipe):
    recipe = plugrl_recipe({"reward.manager": name})
    manager = build_part("reward_managers", name, recipe.reward, part_context(recipe))
    return check_reward_output(manager(batch), batch, name, get_plugin_manager())


def test_a_reward_output_of_the_right_shape_passes(plugins, batch, plugrl_recipe):
    output = scored("scores", batch, plugrl_recipe)
    assert output.token_level_scores.shape == (B, R)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "perresponsescores",
            f"reward manager 'perresponsescores' (plugin 'third-party') returned "
            f"token_level_scores of shape ({B},); expected ({B}, {R}), one row per response and "
            "one column per response token",
        ),
        (
            "integerscores",
            "reward manager 'integerscores' (plugin 'third-party') returned token_level_scores "
            "of dtype torch.int64; expected a floating-point tensor (torch.float32)",
        ),
        (
            "nanscores",
            "reward manager 'nanscores' (plugin 'third-party') returned token_level_scores with "
            "2 values that are not finite (nan or inf), the first in row 1; every value must "
            "be a finite number",
        ),
        (
            "shortextra",
            f"reward manager 'shortextra' (plugin 'third-party') returned extra column 'acc' "
            f"with 2 values; expected {B}, one per response",
        ),
        (
            "scalarextra",
            f"reward manager 'scalarextra' (plugin 'third-party') returned extra column 'acc' "
            f"of type float; expected a list with one value per response ({B})",
        ),
        (
            "plaindict",
            "reward manager 'plaindict' (plugin 'third-party') returned dict; expected a "
            "plugrl.parts.reward.RewardOutput",
        ),
    ],
)
def test_a_reward_output_of_the_wrong_shape_names_the_manager(
    plugins, batch, plugrl_recipe, name, message
):
    with pytest.raises(PluginError) as info:
        scored(name, batch, plugrl_recipe)
    assert str(info.value) == message


def estimated(name, batch, plugrl_recipe):
    recipe = plugrl_recipe({"algorithm.adv_estimator": name})
    return check_estimator_output(
        build_estimator(recipe, get_plugin_manager()).compute(batch),
        batch,
        name,
        get_plugin_manager(),
    )


def test_advantages_of_the_right_shape_pass(plugins, batch, plugrl_recipe):
    advantages, returns = estimated("nanoffresponses", batch, plugrl_recipe)
    assert advantages.shape == returns.shape == (B, R)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "perresponseadvantages",
            f"advantage estimator 'perresponseadvantages' (plugin 'third-party') returned "
            f"advantages of shape ({B},); expected ({B}, {R}), one row per response and one "
            "column per response token",
        ),
        (
            "onlyadvantages",
            "advantage estimator 'onlyadvantages' (plugin 'third-party') returned Tensor; "
            "expected (advantages, returns)",
        ),
        (
            "nanonresponses",
            "advantage estimator 'nanonresponses' (plugin 'third-party') returned advantages "
            f"with {B * R} values that are not finite (nan or inf) on response tokens, the "
            "first in row 0; every value must be a finite number",
        ),
    ],
)
def test_advantages_of_the_wrong_shape_name_the_estimator(
    plugins, batch, plugrl_recipe, name, message
):
    with pytest.raises(PluginError) as info:
        estimated(name, batch, plugrl_recipe)
    assert str(info.value) == message


def test_a_part_built_outside_the_registry_is_named_without_a_plugin(batch):
    with pytest.raises(PluginError) as info:
        check_estimator_output(
            (torch.zeros(B), torch.zeros(B)), batch, "in_a_script", get_plugin_manager()
        )
    assert str(info.value).startswith(
        f"advantage estimator 'in_a_script' returned advantages of shape ({B},); expected"
    )


# -------------------------------------------------------------- where the core receives them


class Actor:
    def update_policy(self, batch, objective):
        return {"actor/pg_loss": 0.0}


def test_the_update_checks_what_the_estimator_returns(plugins, batch, plugrl_recipe):
    recipe = plugrl_recipe({"algorithm.adv_estimator": "perresponseadvantages"})
    parts = SimpleNamespace(
        recipe=recipe,
        plugins=get_plugin_manager(),
        ref=None,
        ref_in_actor=False,
        critic=None,
        kl_in_reward=None,
        estimator=build_estimator(recipe, get_plugin_manager()),
        actor=Actor(),
        objective=None,
        teachers=None,
    )
    with pytest.raises(PluginError, match=r"^advantage estimator 'perresponseadvantages' \("):
        update_from_batch(parts, batch, StepTimer())
    parts.estimator = build_estimator(
        plugrl_recipe({"algorithm.adv_estimator": "grpo"}), get_plugin_manager()
    )
    assert update_from_batch(parts, batch, StepTimer()) == {"actor/pg_loss": 0.0}


class Engines:
    """Two tokens per response, for every prompt."""

    def generate(self, prompts, params):
        return [
            Completion(
                token_ids=[7, 8],
                log_probs=[-0.1, -0.2],
                finish_reason="stop",
                prompt_index=prompt,
                sample_index=sample,
            )
            for prompt in range(len(prompts))
            for sample in range(params.n)
        ]


class Records(list):
    files_key = "data.val_files"


def validation_parts(recipe, manager):
    records = Records(
        PromptRecord(
            index=index,
            prompt_ids=(3, 4, 5),
            data_source="test",
            ground_truth="1",
            extra_info=None,
            ability=None,
            origin=f"val.parquet row {index}",
        )
        for index in range(3)
    )
    return SimpleNamespace(
        val_data=records,
        pad_token_id=0,
        engines=Engines(),
        reward=build_part("reward_managers", manager, recipe.reward, part_context(recipe)),
        tokenizer=None,
        recipe=recipe,
        plugins=get_plugin_manager(),
        with_model_positions=lambda batch: batch,  # text rows keep their positions
    )


def test_validation_checks_what_the_reward_manager_returns(plugins, plugrl_recipe):
    recipe = plugrl_recipe({"reward.manager": "perresponsescores"})
    with pytest.raises(PluginError) as info:
        validate(validation_parts(recipe, "perresponsescores"), recipe, step=0)
    assert str(info.value) == (
        "reward manager 'perresponsescores' (plugin 'third-party') returned token_level_scores "
        "of shape (3,); expected (3, 2), one row per response and one column per response token"
    )
    recipe = plugrl_recipe({"reward.manager": "scores", "trainer.log_val_generations": 0})
    metrics = validate(validation_parts(recipe, "scores"), recipe, step=0)
    assert metrics == {
        "val-core/test/acc/mean@1": pytest.approx(1 / 3),
        "val-aux/test/score/mean@1": pytest.approx(1 / 3),
    }
