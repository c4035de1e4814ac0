"""Engines for a second model that does not train (an LLM judge): built from the run's recipe
with that model and its own rollout section, with its own tokenizer and weights, apart from
the trainer's devices."""

from __future__ import annotations

import asyncio

import pytest

from plugrl.cluster.engines import (
    LocalEngineGroup,
    RayEngineGroup,
    make_frozen_engine_group,
)
from plugrl.data.dataset import load_tokenizer
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.backend import ActorConfig
from plugrl.parts.rollout import RolloutConfig, SamplingParams
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import ClusterConfig, ModelConfig, Recipe, read_section
from plugrl.testing import save_tiny_model
from tests.core.cluster import cluster_fake_engine
from tests.support import SHARED_RAY_CPUS, shared_ray_for_module


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    manager.register(cluster_fake_engine, name="cluster_fake_engine")
    return manager


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("frozen")
    policy = save_tiny_model(root / "policy")
    # another tokenizer: the judge's engine must use its own
    judge = save_tiny_model(root / "judge", texts=["Rating: [[7]] " * 3], seed=1)
    return policy, judge


def test_a_frozen_model_is_served_with_its_own_weights_tokenizer_and_section(plugins, models):
    policy, judge = models
    recipe = Recipe(model=ModelConfig(path=str(policy), dtype="float32"))
    rollout = read_section(
        "rollout", {"engine": "hf", "temperature": 0.0, "lean_decode": False}, plugins, "judge"
    )
    group = make_frozen_engine_group(
        recipe,
        model=ModelConfig(path=str(judge), dtype="float32"),
        rollout=rollout,
        device_name="cpu",
        plugins=plugins,
    )
    try:
        assert isinstance(group, LocalEngineGroup)
        engine = group.engine
        assert engine.context.recipe.model.path == str(judge)
        assert engine.config.lean_decode is False and engine.config.colocate is False
        assert engine.owns_model and not engine.context.model_from_trainer
        own_vocab = load_tokenizer(ModelConfig(path=str(judge))).get_vocab()
        assert engine.context.tokenizer.get_vocab() == own_vocab
        assert own_vocab != load_tokenizer(ModelConfig(path=str(policy))).get_vocab()
        [completion] = group.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))
        assert len(completion.token_ids) == 4 and completion.weight_version == 0
        # a distillation teacher's scores: the judge model's log-probs of given tokens
        scores = group.submit_score([1, 2, 3], completion.token_ids).result()
        assert scores == pytest.approx(
            asyncio.run(engine.score_tokens([1, 2, 3], completion.token_ids))
        )
        assert len(scores) == 4 and all(score <= 0 for score in scores)
        assert recipe.model.path == str(policy)  # the run's recipe is left as it was
    finally:
        group.close()


def test_engines_that_cannot_score_refuse_a_score_request(plugins):
    recipe = Recipe(rollout=RolloutConfig(engine="counting"))
    group = make_frozen_engine_group(
        recipe,
        model=ModelConfig(),
        rollout=RolloutConfig(engine="counting"),
        device_name="cpu",
        plugins=plugins,
    )
    try:
        with pytest.raises(PluginError, match="'counting' cannot score given tokens"):
            group.submit_score([1], [2])
    finally:
        group.close()


@pytest.mark.slow
def test_on_ray_frozen_engines_take_a_placement_of_their_own(plugins):
    recipe = Recipe(
        actor=ActorConfig(backend="fsdp2"),
        rollout=RolloutConfig(engine="counting"),
        cluster=ClusterConfig(mode="ray", num_cpus=SHARED_RAY_CPUS),
    )
    # the judge's section asks to share the trainer's devices; a frozen model never does
    rollout = RolloutConfig(engine="counting", colocate=True, n_gpus_per_node=2)
    with shared_ray_for_module():
        group = make_frozen_engine_group(
            recipe, model=ModelConfig(), rollout=rollout, device_name="cpu", plugins=plugins
        )
        try:
            assert isinstance(group, RayEngineGroup)
            assert group.owns_placement and group.num_engines == 2
            tokens = group.generate([[1], [2]], SamplingParams(max_tokens=3, seed=5))
            assert [len(c.token_ids) for c in tokens] == [3, 3]
        finally:
            group.close()


def test_read_section_keys_its_errors_under_where_the_section_sits(plugins):
    engines = ", ".join(plugins.registry("rollout_engines").names(include_aliases=True))
    transports = ", ".join(plugins.registry("weight_transports").names(include_aliases=True))
    cases = [
        (
            {"engine": "hff"},
            f"reward.judge.rollout.engine: unknown rollout engine 'hff': did you mean 'hf'? "
            f"registered: {engines}",
        ),
        ({"engine": 5}, "reward.judge.rollout.engine: expected a name, got 5"),
        (
            {"engine": "hf", "top_p": 2},
            "reward.judge.rollout.top_p: must be between 0 and 1, got 2.0",
        ),
        (
            {"engine": "hf", "weight_transport": "pigeon"},
            "reward.judge.rollout.weight_transport: unknown weight transport 'pigeon': "
            f"registered: {transports}",
        ),
    ]
    for raw, message in cases:
        with pytest.raises(RecipeError) as caught:
            read_section("rollout", raw, plugins, "reward.judge.rollout")
        assert str(caught.value) == message
