"""Under ``scheduler: fully_async`` the rollouter hands each finished sample to the reward
manager before the buffer, so the trainer's ``score`` finds it scored (``reward.overlap``)."""

from __future__ import annotations

import pytest

import plugrl_sim
from plugrl_reward_managers.early import content_key
from plugrl_reward_managers.managers import ScoringRewardManager
from plugrl_sim.parts import compute_score, sim_recipe

REQUIRED = 4
N = 2


@pytest.fixture
def spied(monkeypatch):
    """The samples handed over early and, per trained batch, its samples and scores."""
    handed: list[list[dict]] = []
    scored: list[tuple[list[dict], list[float], float]] = []
    prefetch, call = ScoringRewardManager.prefetch, ScoringRewardManager.__call__

    def recording_prefetch(self, batch):
        handed.append(self.samples(batch))
        return prefetch(self, batch)

    def recording_call(self, batch):
        output = call(self, batch)
        scores = output.token_level_scores.sum(dim=-1).tolist()
        scored.append((self.samples(batch), scores, output.metrics["perf/reward_prefetched"]))
        return output

    monkeypatch.setattr(ScoringRewardManager, "prefetch", recording_prefetch)
    monkeypatch.setattr(ScoringRewardManager, "__call__", recording_call)
    return handed, scored


def training(records):
    """The records of training samples (the run validates after its last step too)."""

    def split(record):
        samples = record if isinstance(record, list) else record[0]
        return samples[0]["extra_info"]["split"]

    return [record for record in records if split(record) == "train"]


def run(sim_task, tmp_path, plugrl_recipe, plugins, overlap):
    from plugrl.run.runner import run_recipe

    data = sim_recipe(
        sim_task,
        tmp_path / "run",
        scheduler="fully_async",
        colocate=False,
        train_batch_size=REQUIRED,
        n=N,
        max_response_length=32,
        steps=3,
    )
    data["reward"] = {"overlap": overlap}
    run_recipe(plugrl_recipe(data), plugins)


def test_the_rollouter_hands_each_finished_sample_to_the_reward_manager(
    sim_task, tmp_path, plugrl_recipe, plugrl_register_plugin, plugrl_plugin_manager, spied
):
    plugrl_register_plugin(plugrl_sim, "plugrl-sim")
    handed, scored = spied
    run(sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, overlap=True)
    handed, scored = training(handed), training(scored)
    assert handed and all(len(group) == N for group in handed)
    early = {content_key(sample) for group in handed for sample in group}
    assert len(scored) == 3
    for samples, scores, prefetched in scored:
        assert len(samples) == REQUIRED * N and 0.0 <= prefetched <= 1.0
        # every trained response was handed over before the trainer took it, and scored as
        # the scorer scores it
        assert {content_key(sample) for sample in samples} <= early
        assert scores == [compute_score(**sample)["score"] for sample in samples]


def test_without_overlap_nothing_is_handed_over(
    sim_task, tmp_path, plugrl_recipe, plugrl_register_plugin, plugrl_plugin_manager, spied
):
    plugrl_register_plugin(plugrl_sim, "plugrl-sim")
    handed, scored = spied
    run(sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, overlap=False)
    assert handed == [] and len(training(scored)) == 3
    assert all(prefetched == 0.0 for _, _, prefetched in scored)
