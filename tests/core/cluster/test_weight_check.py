"""The weight-sync checks without a model: verl's probability metrics, the threshold per
dtype, weight fingerprints, and the engine group's timeout on a stalled weight update."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import torch

from plugrl.cluster import engines as engines_module
from plugrl.cluster.engines import LocalEngineGroup
from plugrl.cluster.weight_check import (
    PROBS_DIFF_MAX,
    PROBS_DIFF_MEAN,
    PROBS_DIFF_STD,
    PROBS_DIFF_VALID,
    PROBS_PEARSON,
    check_probs_diff,
    rollout_probs_diff_metrics,
)
from plugrl.config import ConfigValueError
from plugrl.errors import PluginError
from plugrl.parts.rollout import (
    RolloutConfig,
    WeightMeta,
    fingerprint_difference,
    weight_fingerprint,
)
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import Recipe
from plugrl.recipe.sections import TrainerConfig
from tests.core.cluster import cluster_fake_engine

# ------------------------------------------------------------------------------- the metrics


def test_the_metrics_are_verls_over_the_response_tokens_on_probabilities():
    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.7, 0.1]]))
    trainer = torch.log(torch.tensor([[0.6, 0.2, 0.1], [0.1, 0.3, 0.3]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the last column is padding
    metrics = rollout_probs_diff_metrics(rollout, trainer, mask)
    gaps = torch.tensor([0.1, 0.0, 0.3, 0.4])
    assert metrics[PROBS_DIFF_VALID] == 1.0
    assert metrics[PROBS_DIFF_MAX] == pytest.approx(0.4, abs=1e-6)
    assert metrics[PROBS_DIFF_MEAN] == pytest.approx(0.2, abs=1e-6)
    # the sample standard deviation (n - 1), as torch.std gives verl
    assert metrics[PROBS_DIFF_STD] == pytest.approx(float(gaps.std()), abs=1e-6)
    expected = torch.corrcoef(torch.tensor([[0.6, 0.2, 0.1, 0.3], [0.5, 0.2, 0.4, 0.7]]))[0, 1]
    assert metrics[PROBS_PEARSON] == pytest.approx(float(expected), abs=1e-6)


def test_equal_probabilities_agree_and_an_empty_mask_logs_nothing():
    same = torch.log(torch.full((2, 3), 0.25))
    metrics = rollout_probs_diff_metrics(same, same.clone(), torch.ones(2, 3))
    assert metrics[PROBS_DIFF_MEAN] == 0.0
    assert metrics[PROBS_PEARSON] == 1.0  # no variance: nothing disagrees
    assert rollout_probs_diff_metrics(same, same, torch.zeros(2, 3)) == {}


# ------------------------------------------------------------------------------ the threshold

CHECK = {
    "thresholds": {"float32": 1e-4, "bfloat16": 2e-2},
    "engine": "vllm",
    "weight_version": 3,
}


def test_beyond_the_threshold_warn_logs_one_line_naming_engine_version_and_metric(caplog):
    metrics = {PROBS_DIFF_MEAN: 0.003, PROBS_DIFF_MAX: 0.2}
    with caplog.at_level(logging.WARNING, logger="plugrl.run"):
        line = check_probs_diff(metrics, mode="warn", dtype="float32", **CHECK)
    assert [r.getMessage() for r in caplog.records] == [line]
    assert line.startswith(
        "weight sync check: rollout engine 'vllm' (float32) sampled at weight version 3 with "
        "token probabilities 0.003 apart from the trainer's on average "
        "(training/rollout_probs_diff_mean, max 0.2; threshold 0.0001, "
        "trainer.weight_sync_thresholds.float32)"
    )
    assert "\n" not in line


def test_error_raises_the_line_and_within_the_threshold_or_off_nothing_happens(caplog):
    with pytest.raises(PluginError, match=r"^weight sync check: rollout engine 'vllm'"):
        check_probs_diff({PROBS_DIFF_MEAN: 0.05}, mode="error", dtype="bfloat16", **CHECK)
    quiet = [
        ({PROBS_DIFF_MEAN: 0.01}, "error", "bfloat16"),  # within
        ({PROBS_DIFF_MEAN: 0.9}, "off", "float32"),
        ({PROBS_DIFF_MEAN: 0.9}, "error", "float16"),  # a dtype without a threshold
    ]
    with caplog.at_level(logging.WARNING):
        for metrics, mode, dtype in quiet:
            assert check_probs_diff(metrics, mode=mode, dtype=dtype, **CHECK) is None
    assert not caplog.records


def test_the_thresholds_key_takes_engine_dtypes_and_non_negative_numbers():
    with pytest.raises(ConfigValueError, match="keys are engine dtypes"):
        TrainerConfig(weight_sync_thresholds={"fp32": 1e-4})
    with pytest.raises(ConfigValueError, match="thresholds must be >= 0"):
        TrainerConfig(weight_sync_thresholds={"float32": -1.0})
    with pytest.raises(ValueError, match="check_weight_sync"):
        TrainerConfig(check_weight_sync="loud")


# ----------------------------------------------------------------------------- fingerprints


def test_a_weight_cast_to_the_engines_dtype_has_the_engines_fingerprint():
    trainer = torch.randn(300, 70, generator=torch.Generator().manual_seed(0))
    engine = trainer.to(torch.bfloat16)
    expected = weight_fingerprint(trainer, torch.bfloat16)
    assert fingerprint_difference(expected, weight_fingerprint(engine)) is None
    # in float32 the engine's rounded copy is another weight
    assert fingerprint_difference(weight_fingerprint(trainer), weight_fingerprint(engine))


def test_a_stale_a_changed_or_a_wrongly_shaped_weight_differs():
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    expected = weight_fingerprint(weight)
    stale = weight - 1e-3 * torch.randn(64, 64, generator=torch.Generator().manual_seed(2))
    assert "sum of squares" in fingerprint_difference(expected, weight_fingerprint(stale))
    one_element = weight.clone()
    one_element[5, 7] += 1e-2
    assert fingerprint_difference(expected, weight_fingerprint(one_element)) is not None
    half = weight[:32]
    assert fingerprint_difference(expected, weight_fingerprint(half)) == (
        "2048 elements, the trainer's 4096"
    )
    # two elements swapped: the same sums, another sample
    swapped = weight.clone().reshape(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert fingerprint_difference(expected, weight_fingerprint(swapped.reshape(64, 64))) == (
        "the same sums but other values in a strided sample"
    )


# ------------------------------------------------------------------------ a stalled transfer


@pytest.fixture
def group():
    plugins = PluginManager()
    plugins.load_entry_points()
    plugins.register(cluster_fake_engine, name="cluster_fake_engine")
    recipe = Recipe(rollout=RolloutConfig(engine="counting", update_weights_timeout_s=0.5))
    made = LocalEngineGroup(recipe, device_name="cpu", plugins=plugins)
    yield made
    made.close()


def _begin(group):
    group.begin_weight_update(1, [WeightMeta("w", (2,), "float32")])


def test_a_load_that_never_returns_ends_in_one_line_naming_the_engine(group, monkeypatch):
    async def stalls(bucket):
        await asyncio.sleep(3600)

    _begin(group)
    monkeypatch.setattr(group.engine, "load_weights", stalls)
    start = time.monotonic()
    with pytest.raises(PluginError) as info:
        group.load_weights([("w", torch.ones(2))])
    assert time.monotonic() - start < 5
    assert str(info.value).startswith(
        "weight sync stalled: engine worker 0 (rollout engine 'counting') did not finish "
        "load_weights within 0.5 s (rollout.update_weights_timeout_s)"
    )


def test_an_engine_that_blocks_its_loop_still_ends_in_one_line(group, monkeypatch):
    monkeypatch.setattr(engines_module, "WEIGHT_TIMEOUT_GRACE_S", 0.5)

    async def blocks():
        time.sleep(3)  # holds the group's event loop: the timeout inside cannot fire

    _begin(group)
    group.load_weights([("w", torch.ones(2))])
    monkeypatch.setattr(group.engine, "finish_weight_update", blocks)
    start = time.monotonic()
    with pytest.raises(PluginError, match=r"^weight sync stalled: an engine worker \(rollout "):
        group.finish_weight_update()
    assert time.monotonic() - start < 2.5


# ---------------------------------------------------------------------- comparing the engines


class _Trainer:
    def __init__(self, weights):
        self.weights = weights

    def named_weights(self):
        return list(self.weights.items())


class _Engines:
    def __init__(self, answers):
        self.recipe = Recipe(rollout=RolloutConfig(engine="vllm"))
        self.answers = answers

    def weight_fingerprints(self, names):
        return self.answers


def test_verify_compares_what_each_engine_read_back_over_the_rows_it_covered():
    import attrs

    from plugrl.cluster.weight_check import verify_fingerprints

    weights = {"a.weight": torch.randn(100, 4), "b.weight": torch.randn(3)}
    first_rows = attrs.evolve(weight_fingerprint(weights["a.weight"][:64]), rows=64)
    good = {"a.weight": first_rows, "b.weight": weight_fingerprint(weights["b.weight"])}
    # one engine read back everything, one left out a weight it cannot read
    engines = _Engines([good, {"b.weight": good["b.weight"]}])
    assert verify_fingerprints(_Trainer(weights), engines, torch.float32, 4) == 1
    stale = dict(good, **{"b.weight": weight_fingerprint(weights["b.weight"] * 2)})
    with pytest.raises(PluginError) as info:
        verify_fingerprints(_Trainer(weights), _Engines([good, stale]), torch.float32, 4)
    assert str(info.value).startswith(
        "weight sync check: engine worker 1 (rollout engine 'vllm') holds other weights than "
        "the trainer's after the sync to version 4: b.weight (sum of squares"
    )
    with pytest.raises(PluginError, match=r"engine worker 0 .* read back none of the 2 weights"):
        verify_fingerprints(_Trainer(weights), _Engines([{}]), torch.float32, 4)


# ------------------------------------------------------------------- the step's check


def test_a_step_checks_only_the_responses_sampled_on_the_trainers_current_weights(caplog):
    from types import SimpleNamespace

    from plugrl.data.batch import Batch
    from plugrl.run.steps import check_rollout_log_probs

    recipe = Recipe(trainer=TrainerConfig(check_weight_sync="error"))
    recipe.rollout.dtype = "float32"
    parts = SimpleNamespace(recipe=recipe, weight_version=5, device=None)
    trainer = torch.log(torch.full((2, 3), 0.5))
    # row 0 on the current weights, agreeing; row 1 sampled on version 4 (asynchronous), far
    engine = torch.stack([trainer[0], torch.log(torch.full((3,), 0.1))])
    batch = Batch(
        {
            "rollout_log_probs": engine,
            "old_log_probs": trainer,
            "response_mask": torch.ones(2, 3),
            "min_weight_version": [5, 4],
        }
    )
    metrics = check_rollout_log_probs(parts, batch)
    # logged over every response, as verl does; checked over the current ones: no error
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(0.2)
    batch["min_weight_version"] = [5, 5]
    with pytest.raises(PluginError, match="at weight version 5"):
        check_rollout_log_probs(parts, batch)
    # top-p sampling: the engine's probabilities are renormalised, not the trainer's
    recipe.rollout.top_p = 0.9
    assert check_rollout_log_probs(parts, batch)["training/rollout_probs_diff_mean"] > 0.1
