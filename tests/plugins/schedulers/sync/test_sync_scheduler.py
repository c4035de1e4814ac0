"""The sync scheduler's own logic, one step at a time, on the simulated parts (real RunParts,
real engine group and weight transport, no model): what a step samples, with which seeds,
which passes it runs, and what it gives the engines."""

from __future__ import annotations

import json

import pytest

import plugrl_sync.scheduler as sync_module
from plugrl.run.runner import RunContext
from plugrl.state.seeds import Stream, round_seed, sampling_seed
from plugrl_sim.parts import sim_recipe
from plugrl_sync.scheduler import SyncScheduler


@pytest.fixture
def step_of(sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager):
    """step_of(**changes) -> (scheduler, parts) of a sim run, its parts built, not started."""
    built = []

    def make(**changes):
        data = sim_recipe(sim_task, tmp_path / "run", train_batch_size=4, n=2, steps=3)
        data["data"]["max_response_length"] = 16
        for dotted, value in changes.items():
            section, _, key = dotted.partition("__")
            *path, leaf = key.split("__") if "__" in key else [key]
            target = data.setdefault(section, {})
            for name in path:
                target = target.setdefault(name, {})
            target[leaf] = value
        recipe = plugrl_recipe(data)
        context = RunContext(recipe, tmp_path / "run", plugrl_plugin_manager, "cpu")
        scheduler = SyncScheduler(recipe.scheduler, context)
        parts = context.build_parts(scheduler.needed_capabilities())
        built.append(parts)
        parts.sync_weights()
        return scheduler, parts

    yield make
    for parts in built:
        parts.close()


@pytest.fixture
def generations(monkeypatch):
    """The sampling params of every generation, in order."""
    seen = []
    generate = sync_module.generate

    def recording(parts, prompts, params):
        seen.append(params)
        return generate(parts, prompts, params)

    monkeypatch.setattr(sync_module, "generate", recording)
    return seen


@pytest.fixture
def trained(monkeypatch):
    """The batches the update was given, in order."""
    seen = []
    update = sync_module.update_from_batch

    def recording(parts, batch, timer):
        seen.append(batch)
        return update(parts, batch, timer)

    monkeypatch.setattr(sync_module, "update_from_batch", recording)
    return seen


def test_a_step_trains_n_responses_per_prompt_then_gives_the_engines_the_weights(
    step_of, generations, trained
):
    scheduler, parts = step_of()
    metrics = scheduler.train_step(parts, 1)
    (params,) = generations
    assert (params.n, params.seed) == (2, round_seed(parts.recipe.trainer.seed, 1))
    (batch,) = trained
    assert len(batch) == 4 * 2 and len(set(batch["uid"])) == 4
    assert {"token_level_scores", "old_log_probs", "advantages"} <= set(batch.keys())
    assert parts.weight_version == 1 and parts.engines.weight_version == 1
    for phase in ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights"):
        assert metrics[f"timing_s/{phase}"] >= 0
    assert metrics["training/global_step"] == 1
    assert metrics["timing_s/step"] >= metrics["timing_s/gen"]


def test_each_step_samples_with_a_seed_of_its_own(step_of, generations):
    scheduler, parts = step_of()
    scheduler.train_step(parts, 1)
    scheduler.train_step(parts, 2)
    seed = parts.recipe.trainer.seed
    assert [p.seed for p in generations] == [round_seed(seed, 1), round_seed(seed, 2)]
    assert parts.weight_version == 2


def test_the_old_log_prob_pass_is_skipped_when_the_update_derives_them(step_of, monkeypatch):
    scheduler, parts = step_of()
    # as with a backend that derives them (fsdp2): the update reads them from its forward
    parts.old_log_probs_from_update = True
    given = []
    monkeypatch.setattr(
        sync_module, "update_from_batch", lambda parts, batch, timer: given.append(batch) or {}
    )
    metrics = scheduler.train_step(parts, 1)
    assert "timing_s/old_log_prob" not in metrics
    assert "old_log_probs" not in given[0]


def test_the_old_log_prob_pass_runs_when_the_recipe_asks_for_it(step_of):
    scheduler, parts = step_of(actor__reuse_on_policy_log_prob=False)
    assert not parts.old_log_probs_from_update
    assert "timing_s/old_log_prob" in scheduler.train_step(parts, 1)


def test_dynamic_sampling_rounds_sample_with_seeds_of_their_own_until_the_batch_is_full(
    step_of, generations, trained
):
    scheduler, parts = step_of(
        algorithm__filter_groups__enable=True,
        algorithm__filter_groups__max_num_gen_batches=20,
    )
    metrics = scheduler.train_step(parts, 1)
    seed = parts.recipe.trainer.seed
    # every round of step 1 has its own seed; the reward is a coin flip per response, so
    # some groups are all equal and it takes more than one round to keep 4 varied groups
    assert [p.seed for p in generations] == [
        round_seed(seed, 1, round_index) for round_index in range(len(generations))
    ]
    assert len(generations) > 1
    # and none draws what validation after step 1 draws
    assert sampling_seed(seed, Stream.VALIDATION, 1) not in {p.seed for p in generations}
    (batch,) = trained
    assert len(set(batch["uid"])) == 4 and len(batch) == 8
    assert metrics["training/global_step"] == 1


def test_remax_baselines_come_from_one_greedy_response_per_prompt(step_of, generations, trained):
    scheduler, parts = step_of(algorithm__adv_estimator="remax")
    scheduler.train_step(parts, 1)
    _sampled, greedy = generations
    assert (greedy.n, greedy.temperature) == (1, 0.0)
    (batch,) = trained
    baselines = batch["reward_baselines"]
    assert len(baselines) == len(batch)
    # one baseline per prompt, repeated for each of its responses
    assert baselines[0::2].tolist() == baselines[1::2].tolist()


def sim_run_records(sim_task, folder, plugrl_recipe, plugins, overlap):
    """The metrics of each step of a short sync run of the simulated parts, validation
    included, with reward.overlap on or off."""
    from plugrl.run.runner import run_recipe

    data = sim_recipe(sim_task, folder, train_batch_size=4, n=4, steps=3)
    data["data"]["max_response_length"] = 64
    data["trainer"].update(test_freq=2, val_before_train=True)
    data["reward"] = {"overlap": overlap}
    run_recipe(plugrl_recipe(data), plugins)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_scoring_while_generating_changes_no_metric(
    sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, monkeypatch
):
    from plugrl_reward_managers.managers import ScoringRewardManager

    prefetched = []
    prefetch = ScoringRewardManager.prefetch

    def recording(self, batch):
        prefetched.append(len(batch))
        return prefetch(self, batch)

    monkeypatch.setattr(ScoringRewardManager, "prefetch", recording)
    plain = sim_run_records(
        sim_task, tmp_path / "plain", plugrl_recipe, plugrl_plugin_manager, False
    )
    assert prefetched == []
    early = sim_run_records(
        sim_task, tmp_path / "early", plugrl_recipe, plugrl_plugin_manager, True
    )
    # each prompt's group as it finished: n=4 for the 4 prompts of each of 3 steps, and one
    # response (val_kwargs.n) for each of the 4 validation prompts, before training, at step 2
    # (test_freq) and after the last step
    assert sorted(prefetched) == [1] * (3 * 4) + [4] * (3 * 4)
    assert [r["step"] for r in early] == [r["step"] for r in plain] == [0, 1, 2, 3]

    def deterministic(record):
        # timing_s/ and perf/ are measured on the machine (perf/reward_prefetched too)
        return {
            key: value
            for key, value in record.items()
            if not key.startswith(("timing_s/", "perf/")) and key != "timestamp"
        }

    for without, with_overlap in zip(plain, early, strict=True):
        assert deterministic(with_overlap) == deterministic(without), with_overlap["step"]
    for without, with_overlap in zip(plain[1:], early[1:], strict=True):
        assert 0.0 <= with_overlap["perf/reward_prefetched"] <= 1.0
        assert without["perf/reward_prefetched"] == 0.0
    assert any(key.startswith("val-core/") for key in early[0])
    assert any(key.startswith("val-core/") for key in early[2])
    assert {"critic/score/mean", "reward/plugrl/sim/acc", "actor/pg_loss"} <= set(early[1])
